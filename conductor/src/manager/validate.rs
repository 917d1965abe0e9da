//! `GET /v1/nodes/{node}/validate`: one line per interface, as Ironic's.
//!
//! # Design
//! `power` is valid when `driver_info` parses and the BMC answers a power-state read with
//! those credentials; `management` when, in addition, none of the operator's readiness checks
//! fails (`vmdeploy-conductor ilo probe`, [`crate::drivers::ilo::probe`]: licence, firmware,
//! TLS, media server...), its reason the first failing check; `deploy` and `boot` are the flow's `validate`
//! (credentials, virtual media licence, deploy ISO, image fields: the `agent_ilo` flow checks
//! them all, so both lines carry its answer). `network` and `storage` are Ironic's `noop`
//! interfaces (always valid); the rest are not supported here (`result: null`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Core, InterfaceValidation, ManagerError};
use crate::bmc::Bmc;
use crate::drivers::ilo::probe;
use crate::store::NodeIdent;

/// Interfaces this conductor does not have.
const UNSUPPORTED: [&str; 5] = ["bios", "console", "inspect", "raid", "rescue"];

fn line(result: Result<(), String>) -> InterfaceValidation {
    match result {
        Ok(()) => InterfaceValidation {
            result: Some(true),
            reason: None,
        },
        Err(reason) => InterfaceValidation {
            result: Some(false),
            reason: Some(reason),
        },
    }
}

/// The readiness probe's verdict: the first failing check, worded for `node validate`.
async fn readiness(node: &crate::store::Node, core: &Arc<Core>) -> Result<(), String> {
    let settings =
        Bmc::settings(node, &core.deploy.config.ilo_defaults).map_err(|e| e.to_string())?;
    let needs = probe::Needs {
        virtual_media: crate::node::hardware_type::NodeInterfaces::shown(node).boot_method()
            == crate::node::hardware_type::BootMethod::VirtualMedia,
    };
    let report = probe::probe_for(&settings.config, None, needs).await;
    match report.first_failure() {
        None => Ok(()),
        Some(check) => Err(format!(
            "readiness check {} failed: {}{}",
            check.check,
            check.detail,
            check
                .action
                .as_deref()
                .map(|a| format!(" ({a})"))
                .unwrap_or_default()
        )),
    }
}

/// Validates every interface of the node.
pub(crate) async fn validate(
    core: &Arc<Core>,
    ident: &NodeIdent,
) -> Result<BTreeMap<String, InterfaceValidation>, ManagerError> {
    let node = core.store().node(ident).await?;
    let mut lines = BTreeMap::new();
    let bmc_check = match Bmc::connect_read_only(&node, &core.deploy.config.ilo_defaults).await {
        Ok(bmc) => bmc.power_state().await.map(|_| ()),
        Err(err) => Err(err),
    }
    .map_err(|e| e.to_string());
    let management_check = match &bmc_check {
        Ok(()) => readiness(&node, core).await,
        Err(e) => Err(e.clone()),
    };
    lines.insert("power".to_string(), line(bmc_check));
    lines.insert("management".to_string(), line(management_check));
    let deploy_check = match core.flow_for(&node) {
        Some(flow) => flow.validate(&node).await.map_err(|e| format!("{e:#}")),
        None => Err(crate::node::hardware_type::no_flow_reason(&node)),
    };
    lines.insert("deploy".to_string(), line(deploy_check.clone()));
    lines.insert("boot".to_string(), line(deploy_check));
    for noop in ["network", "storage"] {
        lines.insert(noop.to_string(), line(Ok(())));
    }
    for name in UNSUPPORTED {
        lines.insert(
            name.to_string(),
            InterfaceValidation {
                result: None,
                reason: Some("not supported".into()),
            },
        );
    }
    tracing::info!(node = %node.uuid, "validated");
    Ok(lines)
}
