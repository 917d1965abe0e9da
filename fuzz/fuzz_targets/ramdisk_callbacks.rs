//! What the deploy ramdisk sends the conductor and the conductor reads back from an agent:
//! heartbeat and `pass_deploy_info` bodies (`api::ipa::Heartbeat`, the conductor's
//! `pass_deploy_info` check), the agent's `agent_status_message` write progress, and the agent's
//! command replies (`CommandResult`, `CommandList`) and API root.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vmdeploy_conductor::api::fuzzing::pass_deploy_info;
use vmdeploy_shared::api::ipa::{
    ApiRoot, ApiVersion, CommandList, CommandResult, Heartbeat, LookupResponse, WriteProgress,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(heartbeat) = Heartbeat::from_json(data) {
        if let Some(message) = heartbeat.agent_status_message.clone() {
            if let Ok(p) = WriteProgress::parse(&message) {
                assert_eq!(
                    WriteProgress::parse(&p.to_message()),
                    Ok(p),
                    "progress round trip"
                );
            }
        }
        if let Err(e) = heartbeat.validate() {
            assert!(!e.to_string().is_empty());
        }
    }
    if let Ok(body) = serde_json::from_slice::<Value>(data) {
        if let Err(e) = pass_deploy_info(body) {
            assert!(!e.message.is_empty());
        }
    }
    if let Ok(result) = CommandResult::from_json(data) {
        if let Some(error) = &result.command_error {
            let _ = error.known_kind();
        }
    }
    let _ = CommandList::from_json(data);
    if let Ok(root) = ApiRoot::from_json(data) {
        if let Ok(v) = root.max_version() {
            assert_eq!(ApiVersion::parse(&v.to_string()), Ok(v));
        }
    }
    if let Ok(lookup) = LookupResponse::from_json(data) {
        let _ = lookup.heartbeat_timeout();
        let _ = lookup.disclosed_token();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = WriteProgress::parse(text) {
            assert_eq!(
                WriteProgress::parse(&p.to_message()),
                Ok(p),
                "progress round trip"
            );
        }
    }
});
