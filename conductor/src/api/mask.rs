//! Secret masking of every JSON the API returns (reference §5.4, DESIGN.md §3, §7): passwords,
//! deploy keys, agent tokens, temp URLs, config drives and image URLs show `******`, however
//! deep they sit in `driver_info`, `instance_info` or `driver_internal_info`.
//!
//! # Design
//! One function, [`mask_secrets`], over a `serde_json::Value`, applied by `render` to every
//! node and port before it leaves. A value is masked for its key (Ironic's `mask_password`
//! patterns, plus the keys Ironic forces: `configdrive`, `image_url`, `agent_secret_token`) or
//! for what it is (a string holding a Swift temp URL signature, whatever its key): a temp URL
//! is a bearer credential for the object behind it.

use serde_json::Value;
use vmdeploy_shared::secret::MASK;

/// Key fragments (lower case) whose values are secrets: Ironic's password patterns
/// (`oslo_utils.strutils._SANITIZE_KEYS`, the ones a node can carry) and ours.
const SECRET_KEY_PARTS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "deploy_key",
    "deployment_key",
    "auth_key",
    "priv_key",
    "private_key",
    "temp_url",
    "tempurl",
];

/// Keys whose values are always masked, whole (Ironic's `show_instance_secrets` policy off).
const SECRET_KEYS: &[&str] = &["configdrive", "image_url"];

/// A marker of a Swift temp URL (`?temp_url_sig=...&temp_url_expires=...`).
const TEMP_URL_MARK: &str = "temp_url_sig=";

/// Whether a key names a secret.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEYS.contains(&key.as_str()) || SECRET_KEY_PARTS.iter().any(|part| key.contains(part))
}

/// Replaces every secret in `value` with `******`, in place, at any depth.
pub fn mask_secrets(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                // A null or empty secret says "not set", and a flag (`..._pregenerated`) is
                // no secret: showing them leaks nothing and tells an operator what is missing.
                let harmless =
                    v.is_null() || v.is_boolean() || v.as_str().is_some_and(str::is_empty);
                if is_secret_key(key) && !harmless {
                    *v = Value::String(MASK.to_string());
                } else {
                    mask_secrets(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_secrets),
        Value::String(s) if holds_live_signature(s) => *s = MASK.to_string(),
        _ => {}
    }
}

/// Whether `text` holds a temp URL signature that is not masked already. A text whose
/// signatures the conductor masked itself (`temp_url_sig=******`, as in a `last_error` quoting
/// the floppy's URL) is no credential, and masking it whole would hide the reason a deploy
/// failed from the operator.
fn holds_live_signature(text: &str) -> bool {
    text.match_indices(TEMP_URL_MARK)
        .any(|(at, mark)| !text[at + mark.len()..].starts_with(MASK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_masked_at_any_depth() {
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "driver_info password",
                json!({"ilo_address": "10.0.0.1", "ilo_username": "admin", "ilo_password": "pw"}),
                json!({"ilo_address": "10.0.0.1", "ilo_username": "admin", "ilo_password": "******"}),
            ),
            (
                "any password key, any case",
                json!({"ipmi_password": "a", "SNMP_AUTH_KEY": "b", "snmp_priv_key": "c", "Passwd": "d"}),
                json!({"ipmi_password": "******", "SNMP_AUTH_KEY": "******", "snmp_priv_key": "******", "Passwd": "******"}),
            ),
            (
                "driver_internal_info agent token and deploy key",
                json!({"agent_secret_token": "tok", "agent_secret_token_pregenerated": true,
                       "deploy_key": "KEY", "deployment_key": "K2",
                       "agent_url": "https://10.0.0.2:9999"}),
                json!({"agent_secret_token": "******", "agent_secret_token_pregenerated": true,
                       "deploy_key": "******", "deployment_key": "******",
                       "agent_url": "https://10.0.0.2:9999"}),
            ),
            (
                "instance_info config drive, image URL, nested capabilities untouched",
                json!({"configdrive": "H4sI...", "image_url": "https://store/x?temp_url_sig=a",
                       "image_source": "http://images/x.qcow2", "root_gb": 10,
                       "capabilities": {"boot_mode": "uefi"}}),
                json!({"configdrive": "******", "image_url": "******",
                       "image_source": "http://images/x.qcow2", "root_gb": 10,
                       "capabilities": {"boot_mode": "uefi"}}),
            ),
            (
                "temp URL under any key, in lists and nested objects",
                json!({"deploy_iso": "https://s:8443/v1/AUTH_x/c/o?temp_url_sig=abc&temp_url_expires=1",
                       "media": [{"url": "https://h/o?temp_url_sig=x"}, "plain"],
                       "deep": {"deeper": {"my_password": "p", "fine": 1}}}),
                json!({"deploy_iso": "******",
                       "media": [{"url": "******"}, "plain"],
                       "deep": {"deeper": {"my_password": "******", "fine": 1}}}),
            ),
            (
                "a text whose signatures are masked already stays readable",
                json!({"last_error": "inserting the virtual floppy: unable to reach https://s/o?temp_url_sig=******&temp_url_expires=1"}),
                json!({"last_error": "inserting the virtual floppy: unable to reach https://s/o?temp_url_sig=******&temp_url_expires=1"}),
            ),
            (
                "one live signature among masked ones masks the text",
                json!({"last_error": "a?temp_url_sig=******&x b?temp_url_sig=live"}),
                json!({"last_error": "******"}),
            ),
            (
                "a secret holding an object is masked whole",
                json!({"temp_url_info": {"key": "k", "url": "u"}}),
                json!({"temp_url_info": "******"}),
            ),
            (
                "unset secrets stay visibly unset",
                json!({"ilo_password": null, "deploy_key": ""}),
                json!({"ilo_password": null, "deploy_key": ""}),
            ),
            (
                "no secrets, no change",
                json!({"a": [1, 2, {"b": "c"}], "d": true}),
                json!({"a": [1, 2, {"b": "c"}], "d": true}),
            ),
        ];
        for (name, mut input, want) in cases {
            mask_secrets(&mut input);
            assert_eq!(input, want, "{name}");
        }
    }

    #[test]
    fn secret_keys() {
        for key in [
            "ilo_password",
            "deploy_key",
            "deployment_key",
            "agent_secret_token",
            "configdrive",
            "image_url",
            "swift_temp_url_key",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "ilo_address",
            "ilo_username",
            "image_source",
            "agent_url",
            "root_gb",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
    }
}
