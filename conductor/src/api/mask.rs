//! Secret masking of every JSON the API returns (docs/ironic-protocols.md §5.4, docs/architecture.md §3, §7): passwords,
//! deploy keys, agent tokens, temp URL signatures, config drives and image URLs show `******`,
//! however deep they sit in `driver_info`, `instance_info` or `driver_internal_info`.
//!
//! # Design
//! `render` applies [`mask_secrets`] to every node and port before it leaves. The key list and
//! the temp URL rule are the ones every log and the agent's log bundle use
//! ([`vmdeploy_shared::redact`], docs/architecture.md §7): a value is masked whole for its key,
//! and a string quoting a temp URL (a `last_error`, a media URL under any key) keeps everything
//! but the signature, so an operator still reads why a deploy failed.

use serde_json::Value;
use vmdeploy_shared::redact;

/// Replaces every secret in `value` with `******`, in place, at any depth.
pub fn mask_secrets(value: &mut Value) {
    redact::json(value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_fields_are_masked() {
        let mut node = json!({
            "driver_info": {"ilo_address": "10.0.0.1", "ilo_password": "pw",
                            "ilo_deploy_iso": "https://s/o?temp_url_sig=abc&temp_url_expires=1"},
            "instance_info": {"configdrive": "H4sI", "image_source": "http://images/x.qcow2"},
            "driver_internal_info": {"agent_secret_token": "tok",
                                     "agent_secret_token_pregenerated": true},
            "last_error": "unable to reach https://s/o?temp_url_sig=live&temp_url_expires=1",
        });
        mask_secrets(&mut node);
        assert_eq!(
            node,
            json!({
                "driver_info": {"ilo_address": "10.0.0.1", "ilo_password": "******",
                                "ilo_deploy_iso": "https://s/o?temp_url_sig=******&temp_url_expires=1"},
                "instance_info": {"configdrive": "******", "image_source": "http://images/x.qcow2"},
                "driver_internal_info": {"agent_secret_token": "******",
                                         "agent_secret_token_pregenerated": true},
                "last_error": "unable to reach https://s/o?temp_url_sig=******&temp_url_expires=1",
            })
        );
    }
}
