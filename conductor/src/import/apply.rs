//! Carrying out a plan against vmdeploy's API: what it has already ([`read_existing`]), and the
//! enrolment of each node taken over ([`apply`]): `POST /v1/nodes`, `POST /v1/ports`, then
//! `manage`, waited for until the node is `manageable`.
//!
//! # Design
//! Each node is enrolled on its own: one that fails is reported and the run goes on with the
//! next, so one bad record never blocks a fleet. Nodes are created and their `manage` asked for
//! first, then all are waited for together (vmdeploy verifies each node's credentials with a
//! power-state read, in the background: docs/ironic-protocols.md §5.2). A node whose plan keeps
//! it in `enroll` (a credential the source did not give) is not managed. Nothing is rolled back:
//! a node whose port or `manage` failed stays, so what the report says is what vmdeploy has, and
//! a second run skips it as already there.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::client::ApiClient;
use super::mapping::{Existing, Plan};

/// How often a managed node's state is read while waiting.
const POLL: Duration = Duration::from_millis(500);

/// What became of one node taken over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeResult {
    /// Whether `POST /v1/nodes` succeeded.
    pub enrolled: bool,
    /// Ports created.
    pub ports: usize,
    /// Its provision state in vmdeploy at the end, when known.
    pub provision_state: Option<String>,
    /// What failed, if anything.
    pub errors: Vec<String>,
}

impl NodeResult {
    /// Whether anything failed.
    pub fn failed(&self) -> bool {
        !self.errors.is_empty()
    }
}

/// The nodes (UUID, name) and port addresses vmdeploy has.
pub async fn read_existing(api: &ApiClient) -> anyhow::Result<Existing> {
    let mut existing = Existing::default();
    for node in api.list("/v1/nodes", "nodes").await? {
        if let Some(uuid) = node.get("uuid").and_then(Value::as_str) {
            existing.uuids.insert(uuid.to_ascii_lowercase());
        }
        if let Some(name) = node.get("name").and_then(Value::as_str) {
            existing.names.insert(name.to_string());
        }
    }
    for port in api.list("/v1/ports/detail", "ports").await? {
        if let (Some(address), Some(node)) = (
            port.get("address").and_then(Value::as_str),
            port.get("node_uuid").and_then(Value::as_str),
        ) {
            existing
                .port_addresses
                .insert(address.to_ascii_lowercase(), node.to_string());
        }
    }
    Ok(existing)
}

/// Enrolls every node `plan` takes over; one result per plan node (`None`: not taken over).
pub async fn apply(
    api: &ApiClient,
    plan: &Plan,
    manage_timeout: Duration,
) -> Vec<Option<NodeResult>> {
    let mut results: Vec<Option<NodeResult>> = vec![None; plan.nodes.len()];
    // Node UUID → index of the nodes waited for in `manage`.
    let mut managing: HashMap<String, usize> = HashMap::new();
    for (i, node) in plan.nodes.iter().enumerate() {
        let (Some(t), Some(uuid)) = (node.take_over(), node.uuid.as_deref()) else {
            continue;
        };
        let mut result = NodeResult::default();
        let body = Value::Object(t.body.clone());
        match api.send(Method::POST, "/v1/nodes", Some(&body)).await {
            Ok(created) => {
                result.enrolled = true;
                result.provision_state = created
                    .get("provision_state")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                tracing::info!(node = uuid, driver = t.driver, "enrolled");
            }
            Err(err) => {
                result.errors.push(format!("enrolling: {err}"));
                results[i] = Some(result);
                continue;
            }
        }
        for port in &t.ports {
            let mut body = port.body.clone();
            body.insert("node_uuid".into(), json!(uuid));
            match api
                .send(Method::POST, "/v1/ports", Some(&Value::Object(body)))
                .await
            {
                Ok(_) => result.ports += 1,
                Err(err) => result
                    .errors
                    .push(format!("creating port {}: {err}", port.address)),
            }
        }
        if t.stays_enroll.is_empty() && !result.failed() {
            let path = format!("/v1/nodes/{uuid}/states/provision");
            match api
                .send(Method::PUT, &path, Some(&json!({"target": "manage"})))
                .await
            {
                Ok(_) => {
                    managing.insert(uuid.to_string(), i);
                }
                Err(err) => result.errors.push(format!("asking for manage: {err}")),
            }
        }
        results[i] = Some(result);
    }
    wait_managed(api, managing, &mut results, manage_timeout).await;
    results
}

/// Waits until every node of `managing` has left `verifying`: `manageable`, or back in
/// `enroll` with the conductor's `last_error`.
async fn wait_managed(
    api: &ApiClient,
    mut managing: HashMap<String, usize>,
    results: &mut [Option<NodeResult>],
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while !managing.is_empty() {
        let mut done = Vec::new();
        for (uuid, &i) in &managing {
            let node = match api.get(&format!("/v1/nodes/{uuid}")).await {
                Ok(node) => node,
                // A read that fails is tried again until the deadline.
                Err(err) => {
                    tracing::warn!(node = uuid.as_str(), "reading the node: {err}");
                    continue;
                }
            };
            let state = node.get("provision_state").and_then(Value::as_str);
            let target = node.get("target_provision_state").and_then(Value::as_str);
            let last_error = node.get("last_error").and_then(Value::as_str);
            let Some(result) = results.get_mut(i).and_then(Option::as_mut) else {
                done.push(uuid.clone());
                continue;
            };
            result.provision_state = state.map(str::to_string);
            match (state, target, last_error) {
                (Some("manageable"), None, _) => done.push(uuid.clone()),
                (Some("enroll"), None, Some(error)) => {
                    result.errors.push(format!("manage failed: {error}"));
                    done.push(uuid.clone());
                }
                (Some(other), None, _) if other != "enroll" && other != "verifying" => {
                    result
                        .errors
                        .push(format!("manage ended in {other}, not manageable"));
                    done.push(uuid.clone());
                }
                _ => {}
            }
        }
        for uuid in done {
            managing.remove(&uuid);
        }
        if managing.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            for &i in managing.values() {
                if let Some(result) = results.get_mut(i).and_then(Option::as_mut) {
                    result.errors.push(format!(
                        "manage did not finish within {} s (provision state {})",
                        limit.as_secs(),
                        result.provision_state.as_deref().unwrap_or("unknown")
                    ));
                }
            }
            break;
        }
        tokio::time::sleep(POLL).await;
    }
}
