//! Automated cleaning through the agent (Ironic's `prepare_cleaning` and agent clean steps;
//! docs/ironic-protocols.md §3.3, §3.5, §5.3), on top of a deploy interface: for `agent_ilo`
//! and `iscsi_ilo` nodes alike, whose virtual-media boot boots the same deploy ISO, whose
//! agent serves the `clean` extension. The deploy hands over its boot interface
//! ([`super::Cleaning`]).
//!
//! # Design
//! - [`prepare`]: the agent ramdisk boots exactly as an agent deploy boots it
//!   ([`BootInterface::prepare_ramdisk`] with a fresh agent token); the manager moves the node
//!   to `clean wait`.
//! - [`heartbeat`], on the agent's first heartbeat in `clean wait` (the manager has moved the
//!   node to `cleaning` and holds it): the heartbeat is recorded and the agent's certificate
//!   pinned as in a deploy; `clean.get_clean_steps`, then [`plan`] keeps the steps with a
//!   priority above 0 after the conductor's overrides (`erase_devices` off) in Ironic's order;
//!   each runs through `clean.execute_clean_step` (asynchronous in IPA), whose command is
//!   polled by id until it ends or [`CleanTiming::step_timeout`] passes. Then the agent powers
//!   the node off (the iLO if it does not), both media are ejected, the floppy deleted and the
//!   token wiped, as at the end of an agent deploy.
//! - `driver_internal_info` holds Ironic's keys while cleaning runs (`clean_steps`,
//!   `clean_step_index`, `hardware_manager_version`), from which the API renders the node's
//!   `clean_step` ([`current_step`]); `clean_steps_run` keeps what ran and how it ended.
//!
//! Failures come back as errors in operator words; the manager records them in `last_error`,
//! moves the node to `clean failed` and runs the flow's clean-up (power off, media, floppy,
//! token), the same as after a failed deploy.
//!
//! # Limitations
//! The steps run on the agent's install disk only (the one the root device hints pick), not
//! on every disk of the node as IPA's `erase_devices_metadata` does. No manual cleaning, no
//! steps that reboot, no abort of a running step (`abort` only stops the wait).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use time::OffsetDateTime;
use vmdeploy_shared::api::clean::{
    CleanStep, CleanStepsResult, ExecuteCleanStepParams, HardwareManagerVersion, ERASE_DEVICES,
    EXECUTE_CLEAN_STEP, GET_CLEAN_STEPS,
};
use vmdeploy_shared::api::ipa::{CommandResult, CommandStatus, ValidHeartbeat};

use super::agent_session::client::AgentClient;
use super::agent_session::{
    agent_client, agent_failure, clear_agent_fields, power_off_through_agent, record_heartbeat,
};
use super::DeployContext;
use crate::bmc::Bmc;
use crate::boot::{BootInterface, Ramdisk};
use crate::store::{JsonObject, Node};

/// `driver_internal_info`: the steps of this cleaning, in the order they run (Ironic's key).
pub const CLEAN_STEPS_KEY: &str = "clean_steps";
/// `driver_internal_info`: the index of the running step in [`CLEAN_STEPS_KEY`] (Ironic's key).
pub const CLEAN_STEP_INDEX_KEY: &str = "clean_step_index";
/// `driver_internal_info`: the agent's `hardware_manager_version`, sent with every step
/// (Ironic's key).
pub const HARDWARE_MANAGER_VERSION_KEY: &str = "hardware_manager_version";
/// `driver_internal_info`: the steps the last cleaning ran, `{"step", "interface", "priority",
/// "status", "finished_at"}` each (vmdeploy's; kept after cleaning ends).
pub const STEPS_RUN_KEY: &str = "clean_steps_run";

/// Ironic's order among steps of equal priority: the interface with the higher rank first
/// (`ironic/conductor/steps.py` `CLEANING_INTERFACE_PRIORITY`).
fn interface_rank(interface: &str) -> u8 {
    match interface {
        "power" => 5,
        "management" => 4,
        "deploy" => 3,
        "bios" => 2,
        "raid" => 1,
        _ => 0,
    }
}

/// The conductor's priorities for agent steps, over the agent's (Ironic's
/// `[deploy]erase_devices_priority` and friends): `erase_devices` (a full overwrite, hours on a
/// real disk) is off; `erase_devices_metadata` keeps the agent's 99.
const PRIORITY_OVERRIDES: [(&str, i64); 1] = [(ERASE_DEVICES, 0)];

/// How long a clean step may run and how often its command is polled.
#[derive(Debug, Clone, Copy)]
pub struct CleanTiming {
    /// Pause between two polls of the running step.
    pub poll_interval: Duration,
    /// Longest a step may run (Ironic bounds it by the clean callback timeout).
    pub step_timeout: Duration,
    /// Polls in a row that may fail (the agent unreachable) before cleaning fails.
    pub poll_failures: u32,
}

impl Default for CleanTiming {
    fn default() -> CleanTiming {
        CleanTiming {
            poll_interval: Duration::from_secs(2),
            step_timeout: Duration::from_secs(1800),
            poll_failures: 5,
        }
    }
}

/// The steps to run, in order: every manager's steps after [`PRIORITY_OVERRIDES`], those with
/// a priority above 0, a step offered twice kept once at its highest priority, sorted by
/// priority then interface rank, highest first.
pub fn plan(listed: &CleanStepsResult) -> Vec<CleanStep> {
    let mut steps: Vec<CleanStep> = Vec::new();
    for step in listed.clean_steps.values().flatten() {
        let mut step = step.clone();
        if let Some((_, p)) = PRIORITY_OVERRIDES.iter().find(|(n, _)| *n == step.step) {
            step.priority = *p;
        }
        if step.priority <= 0 {
            continue;
        }
        match steps
            .iter_mut()
            .find(|s| s.step == step.step && s.interface == step.interface)
        {
            Some(known) if known.priority >= step.priority => {}
            Some(known) => *known = step,
            None => steps.push(step),
        }
    }
    steps.sort_by_key(|s| std::cmp::Reverse((s.priority, interface_rank(&s.interface))));
    steps
}

/// The running step as the API's `clean_step` shows it: the step at `clean_step_index` of
/// `clean_steps`, else `{}`.
pub fn current_step(info: &JsonObject) -> Value {
    let index = info.get(CLEAN_STEP_INDEX_KEY).and_then(Value::as_u64);
    let step = index.and_then(|i| {
        info.get(CLEAN_STEPS_KEY)
            .and_then(Value::as_array)
            .and_then(|steps| steps.get(usize::try_from(i).ok()?))
    });
    match step {
        Some(step @ Value::Object(_)) => step.clone(),
        _ => json!({}),
    }
}

/// Forgets the plan of a cleaning that ended (the record of what ran stays).
pub fn forget_plan(info: &mut JsonObject) {
    for key in [
        CLEAN_STEPS_KEY,
        CLEAN_STEP_INDEX_KEY,
        HARDWARE_MANAGER_VERSION_KEY,
    ] {
        info.remove(key);
    }
}

/// Boots the agent ramdisk for cleaning; the node is then left to wait for its heartbeat.
pub(super) async fn prepare(
    ctx: &DeployContext,
    boot: &dyn BootInterface,
    node: &mut Node,
) -> anyhow::Result<()> {
    clear_agent_fields(&mut node.driver_internal_info);
    forget_plan(&mut node.driver_internal_info);
    let bmc = Bmc::connect(node, &ctx.config.ilo_defaults).await?;
    boot.prepare_ramdisk(&bmc, node, Ramdisk::Agent)
        .await
        .context("booting the agent ramdisk for cleaning")
}

/// Runs the cleaning on the agent's first heartbeat in `clean wait`; see the module docs.
pub(super) async fn heartbeat(
    ctx: &DeployContext,
    boot: &dyn BootInterface,
    node: &mut Node,
    hb: &ValidHeartbeat,
    timing: &CleanTiming,
) -> anyhow::Result<()> {
    let outcome = run(ctx, boot, node, hb, timing).await;
    if outcome.is_err() {
        forget_plan(&mut node.driver_internal_info);
    }
    outcome
}

async fn run(
    ctx: &DeployContext,
    boot: &dyn BootInterface,
    node: &mut Node,
    hb: &ValidHeartbeat,
    timing: &CleanTiming,
) -> anyhow::Result<()> {
    record_heartbeat(&mut node.driver_internal_info, hb)?;
    let client = agent_client(ctx, node)?;
    let (view, ports) = node_view(ctx, node).await?;
    let listed = client
        .execute(GET_CLEAN_STEPS, json!({"node": view, "ports": ports}), true)
        .await
        .context("asking the agent for its clean steps (clean.get_clean_steps)")?;
    if listed.command_status != CommandStatus::Succeeded {
        bail!(agent_failure("listing the clean steps", &listed));
    }
    let listed: CleanStepsResult =
        serde_json::from_value(listed.command_result.unwrap_or(Value::Null))
            .context("reading the agent's clean steps (clean.get_clean_steps result)")?;
    let steps = plan(&listed);
    tracing::info!(node = %node.uuid, steps = ?steps.iter().map(|s| s.step.as_str()).collect::<Vec<_>>(), "clean steps to run");
    let info = &mut node.driver_internal_info;
    info.insert(CLEAN_STEPS_KEY.into(), json!(steps));
    info.insert(
        HARDWARE_MANAGER_VERSION_KEY.into(),
        json!(listed.hardware_manager_version),
    );
    info.insert(STEPS_RUN_KEY.into(), json!([]));
    for (index, step) in steps.iter().enumerate() {
        node.driver_internal_info
            .insert(CLEAN_STEP_INDEX_KEY.into(), json!(index));
        ctx.store
            .update_node(node)
            .await
            .context("saving the running clean step")?;
        tracing::info!(node = %node.uuid, step = %step.step, "clean step starting");
        let outcome = run_step(
            &client,
            step,
            &view,
            &ports,
            &listed.hardware_manager_version,
            timing,
        )
        .await;
        record_step(node, step, outcome.is_ok());
        outcome?;
        tracing::info!(node = %node.uuid, step = %step.step, "clean step done");
    }
    node.driver_internal_info.remove(CLEAN_STEP_INDEX_KEY);
    let bmc = Bmc::connect(node, &ctx.config.ilo_defaults).await?;
    power_off_through_agent(&bmc, &client, node, ctx.config.agent_power_off_wait).await?;
    boot.clean_up_ramdisk(Some(&bmc), node).await;
    clear_agent_fields(&mut node.driver_internal_info);
    forget_plan(&mut node.driver_internal_info);
    tracing::info!(node = %node.uuid, "cleaned: powered off, media ejected");
    Ok(())
}

/// What the agent sees of the node and its ports: identity and properties, no secrets.
async fn node_view(ctx: &DeployContext, node: &Node) -> anyhow::Result<(Value, Value)> {
    let ports = ctx.node_ports(node.uuid).await?;
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"uuid": p.uuid, "address": p.address}))
        .collect();
    let view = json!({
        "uuid": node.uuid,
        "driver": node.driver,
        "properties": Value::Object(node.properties.clone()),
    });
    Ok((view, Value::Array(ports)))
}

/// Runs one step and waits for its end.
async fn run_step(
    client: &AgentClient,
    step: &CleanStep,
    view: &Value,
    ports: &Value,
    version: &HardwareManagerVersion,
    timing: &CleanTiming,
) -> anyhow::Result<()> {
    let params = ExecuteCleanStepParams {
        step: step.clone(),
        node: view.clone(),
        ports: ports.clone(),
        clean_version: Some(version.clone()),
    };
    let what = format!("clean step {}", step.step);
    let started = client
        .execute(
            EXECUTE_CLEAN_STEP,
            serde_json::to_value(&params).context("writing the clean step's parameters")?,
            false,
        )
        .await
        .with_context(|| format!("asking the agent to run {what} (clean.execute_clean_step)"))?;
    let done = match started.command_status {
        CommandStatus::Running => wait_for(client, &started.id, &what, timing).await?,
        _ => started,
    };
    match done.command_status {
        CommandStatus::Succeeded => Ok(()),
        _ => bail!(agent_failure(&what, &done)),
    }
}

/// Polls command `id` until it is no longer running.
async fn wait_for(
    client: &AgentClient,
    id: &str,
    what: &str,
    timing: &CleanTiming,
) -> anyhow::Result<CommandResult> {
    let deadline = Instant::now() + timing.step_timeout;
    let mut failures = 0;
    loop {
        tokio::time::sleep(timing.poll_interval).await;
        match client.command_status(id).await {
            Ok(r) if r.command_status != CommandStatus::Running => return Ok(r),
            Ok(_) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures >= timing.poll_failures {
                    return Err(e.context(format!(
                        "the agent stopped answering while {what} ran ({failures} polls failed)"
                    )));
                }
                tracing::warn!(error = %format!("{e:#}"), "polling the clean step failed; trying again");
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "{what} did not finish within {} s: the agent still reports it running",
                timing.step_timeout.as_secs()
            );
        }
    }
}

/// Adds the step's outcome to [`STEPS_RUN_KEY`].
fn record_step(node: &mut Node, step: &CleanStep, succeeded: bool) {
    let entry = json!({
        "step": step.step,
        "interface": step.interface,
        "priority": step.priority,
        "status": if succeeded { "succeeded" } else { "failed" },
        "finished_at": OffsetDateTime::now_utc().unix_timestamp(),
    });
    match node.driver_internal_info.get_mut(STEPS_RUN_KEY) {
        Some(Value::Array(run)) => run.push(entry),
        _ => {
            node.driver_internal_info
                .insert(STEPS_RUN_KEY.into(), json!([entry]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
    use std::sync::Arc;
    use vmdeploy_shared::api::clean::{ERASE_DEVICES_METADATA, HARDWARE_MANAGER};

    fn step(name: &str, priority: i64, interface: &str) -> CleanStep {
        CleanStep {
            step: name.into(),
            priority,
            interface: interface.into(),
            reboot_requested: false,
            abortable: true,
        }
    }

    fn listed(managers: &[(&str, Vec<CleanStep>)]) -> CleanStepsResult {
        CleanStepsResult {
            clean_steps: managers
                .iter()
                .map(|(m, s)| (m.to_string(), s.clone()))
                .collect(),
            hardware_manager_version: BTreeMap::new(),
        }
    }

    #[test]
    fn ipas_default_steps_run_erase_devices_metadata_only() {
        // What upstream IPA's GenericHardwareManager lists.
        let steps = plan(&listed(&[(
            HARDWARE_MANAGER,
            vec![
                step(ERASE_DEVICES, 10, "deploy"),
                step(ERASE_DEVICES_METADATA, 99, "deploy"),
                step("erase_pstore", 0, "deploy"),
                step("delete_configuration", 0, "raid"),
            ],
        )]));
        assert_eq!(steps, vec![step(ERASE_DEVICES_METADATA, 99, "deploy")]);
    }

    #[test]
    fn steps_run_by_priority_then_interface_highest_first() {
        let steps = plan(&listed(&[
            (
                "A",
                vec![
                    step("low", 5, "deploy"),
                    step("raid_same", 50, "raid"),
                    step("deploy_same", 50, "deploy"),
                    step("off", 0, "deploy"),
                    step("negative", -1, "deploy"),
                ],
            ),
            (
                "B",
                vec![
                    step("power_same", 50, "power"),
                    step("top", 100, "management"),
                    // Offered by both managers: kept once, at the higher priority.
                    step("low", 7, "deploy"),
                ],
            ),
        ]));
        let names: Vec<(&str, i64)> = steps
            .iter()
            .map(|s| (s.step.as_str(), s.priority))
            .collect();
        assert_eq!(
            names,
            vec![
                ("top", 100),
                ("power_same", 50),
                ("deploy_same", 50),
                ("raid_same", 50),
                ("low", 7),
            ]
        );
        assert!(plan(&listed(&[])).is_empty());
    }

    #[test]
    fn the_running_step_is_rendered_from_ironics_keys() {
        let mut info = JsonObject::new();
        assert_eq!(current_step(&info), json!({}));
        info.insert(
            CLEAN_STEPS_KEY.into(),
            json!([
                step("a", 9, "deploy"),
                step(ERASE_DEVICES_METADATA, 5, "deploy")
            ]),
        );
        assert_eq!(current_step(&info), json!({}), "no index: nothing runs");
        info.insert(CLEAN_STEP_INDEX_KEY.into(), json!(1));
        assert_eq!(
            current_step(&info),
            json!({"step": "erase_devices_metadata", "priority": 5, "interface": "deploy",
                   "reboot_requested": false, "abortable": true})
        );
        info.insert(CLEAN_STEP_INDEX_KEY.into(), json!(7));
        assert_eq!(current_step(&info), json!({}), "index out of range");
        info.insert(STEPS_RUN_KEY.into(), json!([{"step": "a"}]));
        forget_plan(&mut info);
        assert_eq!(current_step(&info), json!({}));
        assert!(info.contains_key(STEPS_RUN_KEY), "the record stays");
        assert!(!info.contains_key(CLEAN_STEPS_KEY));
    }

    #[test]
    fn outcomes_are_recorded_in_order() {
        let mut node = Node::new(
            uuid::Uuid::new_v4(),
            "agent_ilo",
            crate::states::ProvisionState::Cleaning,
        );
        record_step(&mut node, &step("a", 9, "deploy"), true);
        record_step(&mut node, &step("b", 8, "raid"), false);
        let run = node.driver_internal_info[STEPS_RUN_KEY]
            .as_array()
            .expect("a list")
            .clone();
        assert_eq!(run.len(), 2);
        assert_eq!(run[0]["step"], "a");
        assert_eq!(run[0]["status"], "succeeded");
        assert_eq!(run[1]["interface"], "raid");
        assert_eq!(run[1]["status"], "failed");
    }

    /// An agent that lists IPA's steps, runs `execute_clean_step` as `RUNNING` and reports it
    /// `FAILED` after `running_polls` polls; `polls_fail` makes every poll a 500.
    async fn fake_agent(running_polls: usize, polls_fail: bool) -> (String, Arc<AtomicUsize>) {
        use axum::routing::{get, post};
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&polls);
        let result = |status: &str, name: &str, extra: Value| {
            let mut v = json!({"id": "cmd-1", "command_name": name, "command_params": {},
                               "command_status": status, "command_error": null,
                               "command_result": null});
            if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
                v.extend(extra);
            }
            v
        };
        let app = axum::Router::new()
            .route(
                "/v1/commands/",
                post(move |axum::Json(body): axum::Json<Value>| async move {
                    let name = body["name"].as_str().unwrap_or_default().to_owned();
                    axum::Json(match name.as_str() {
                        "clean.get_clean_steps" => result(
                            "SUCCEEDED",
                            "get_clean_steps",
                            json!({"command_result": {
                                "clean_steps": {"GenericHardwareManager": [
                                    {"step": "erase_devices", "priority": 10,
                                     "interface": "deploy"},
                                    {"step": "erase_devices_metadata", "priority": 99,
                                     "interface": "deploy"}]},
                                "hardware_manager_version": {"generic_hardware_manager": "1.1"}
                            }}),
                        ),
                        _ => result("RUNNING", "execute_clean_step", json!({})),
                    })
                }),
            )
            .route(
                "/v1/commands/{id}",
                get(move || {
                    let n = counted.fetch_add(1, AtomicOrdering::SeqCst);
                    async move {
                        if polls_fail {
                            return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "down")
                                .into_response();
                        }
                        let v = if n < running_polls {
                            result("RUNNING", "execute_clean_step", json!({}))
                        } else {
                            result(
                                "FAILED",
                                "execute_clean_step",
                                json!({"command_error": {"type": "CleaningError", "code": 500,
                                       "message": "Error performing clean_step \
                                                   erase_devices_metadata: disk on fire",
                                       "details": ""}}),
                            )
                        };
                        axum::Json(v).into_response()
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, polls)
    }

    struct NoObjects;

    #[async_trait::async_trait]
    impl crate::objects::ObjectStore for NoObjects {
        async fn put(
            &self,
            _: &crate::objects::ObjectPath,
            _: crate::objects::ObjectBody,
            _: &crate::objects::PutOptions,
        ) -> Result<(), crate::objects::ObjectError> {
            Err(crate::objects::ObjectError::Unavailable("none".into()))
        }
        async fn delete(
            &self,
            _: &crate::objects::ObjectPath,
        ) -> Result<bool, crate::objects::ObjectError> {
            Err(crate::objects::ObjectError::Unavailable("none".into()))
        }
        async fn head(
            &self,
            p: &crate::objects::ObjectPath,
        ) -> Result<crate::objects::ObjectInfo, crate::objects::ObjectError> {
            Err(crate::objects::ObjectError::NotFound(p.clone()))
        }
        async fn temp_url(
            &self,
            _: &crate::objects::ObjectPath,
            _: Duration,
        ) -> Result<String, crate::objects::ObjectError> {
            Err(crate::objects::ObjectError::Unavailable("none".into()))
        }
        fn kind(&self) -> &'static str {
            "none"
        }
    }

    /// Runs the cleaning heartbeat of a node against the agent at `url`.
    async fn clean_against(url: &str) -> (anyhow::Result<()>, Node) {
        let dir = tempfile::tempdir().expect("dir");
        let store =
            crate::store::sqlite::SqliteStore::open(&dir.path().join("db.sqlite")).expect("db");
        let ctx = Arc::new(DeployContext {
            store: store.clone(),
            objects: Arc::new(NoObjects),
            config: super::super::DeployConfig::for_tests(),
            images: None,
            boot_isos: None,
            netboot: None,
        });
        let boot = crate::boot::vmedia::VirtualMediaBoot::new(ctx.clone());
        let mut node = Node::new(
            uuid::Uuid::new_v4(),
            "agent_ilo",
            crate::states::ProvisionState::Cleaning,
        );
        node.driver_internal_info
            .insert("agent_secret_token".into(), json!("t".repeat(43)));
        crate::store::Store::create_node(store.as_ref(), &node)
            .await
            .expect("node");
        let hb = ValidHeartbeat {
            callback_url: url.to_owned(),
            agent_token: None,
            agent_version: Some("1".into()),
            agent_verify_ca: None,
            agent_status: None,
            agent_status_message: None,
        };
        let timing = CleanTiming {
            poll_interval: Duration::from_millis(20),
            step_timeout: Duration::from_secs(10),
            poll_failures: 3,
        };
        let outcome = heartbeat(&ctx, &boot, &mut node, &hb, &timing).await;
        (outcome, node)
    }

    #[tokio::test]
    async fn a_step_the_agent_fails_is_polled_to_its_end_and_reported() {
        let (url, polls) = fake_agent(3, false).await;
        let (outcome, node) = clean_against(&url).await;
        let err = format!("{:#}", outcome.expect_err("the step failed"));
        assert!(
            err.contains("clean step erase_devices_metadata failed on the node")
                && err.contains("disk on fire")
                && err.contains("CleaningError"),
            "{err}"
        );
        assert_eq!(
            polls.load(AtomicOrdering::SeqCst),
            4,
            "RUNNING 3 times, then FAILED"
        );
        let run = &node.driver_internal_info[STEPS_RUN_KEY];
        assert_eq!(run[0]["step"], "erase_devices_metadata");
        assert_eq!(run[0]["status"], "failed");
        assert_eq!(
            run.as_array().map(Vec::len),
            Some(1),
            "erase_devices is off"
        );
        assert!(!node.driver_internal_info.contains_key(CLEAN_STEPS_KEY));
    }

    #[tokio::test]
    async fn an_agent_that_stops_answering_fails_the_step() {
        let (url, polls) = fake_agent(0, true).await;
        let (outcome, _) = clean_against(&url).await;
        let err = format!("{:#}", outcome.expect_err("unreachable"));
        assert!(err.contains("stopped answering"), "{err}");
        assert_eq!(polls.load(AtomicOrdering::SeqCst), 3);
    }
}
