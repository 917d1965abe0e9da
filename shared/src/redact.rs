//! Redaction: which keys name secrets, and how a text, a URL or a JSON value loses its secrets
//! before it is logged, shown by the API, written to `last_error` or put in the agent's log
//! bundle (docs/architecture.md §7).
//!
//! # Design
//! One key list and one temp-URL rule, used by every end:
//! - **Keys**: a key names a secret when it holds one of [`SECRET_KEY_PARTS`] (Ironic's password
//!   patterns that a node can carry, plus ours) or is one of [`SECRET_KEYS`]. Keys are compared
//!   in lower case with `-` read as `_`, so the floppy's `ipa-agent-token` and
//!   `vmdeploy-iscsi-chap-secret` match as `driver_internal_info.agent_secret_token` does.
//! - **Temp URLs**: a Swift temp URL is a bearer credential for its object; its
//!   `temp_url_sig` value is masked wherever it shows, in a URL or in any text quoting one
//!   ([`signatures`]). The rest of the URL stays, so an operator still sees which object failed.
//!
//! On top of these: [`json`] masks an API body or a node's info map, [`text`] masks free text
//! (a log bundle: known secret values, `key=value` / `"key": "value"` pairs whose key names a
//! secret, and signatures), and [`Url`] shows a URL in a log field.

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;

pub use crate::secret::MASK;

/// Key fragments (lower case, `_` for `-`) whose values are secrets: passwords, tokens, keys
/// and temp URL material.
pub const SECRET_KEY_PARTS: &[&str] = &[
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

/// Whole keys whose values are always secret, whatever their shape: a config drive carries the
/// instance's user data, and Ironic never shows an `image_url` (it may be a temp URL).
pub const SECRET_KEYS: &[&str] = &["configdrive", "image_url"];

/// The query parameter of a Swift temp URL that carries its signature.
pub const TEMP_URL_SIG: &str = "temp_url_sig";

/// Whether `key` names a secret ([`SECRET_KEY_PARTS`], [`SECRET_KEYS`]).
pub fn is_secret_key(key: &str) -> bool {
    // Compared in place, without a lowered copy: the API masks every key of every node it
    // lists (a page of 1,000 nodes has some 50,000 keys).
    let key = key.as_bytes();
    let same = |a: &u8, b: &u8| a.to_ascii_lowercase() == *b || (*a == b'-' && *b == b'_');
    let equals = |word: &str| {
        key.len() == word.len() && key.iter().zip(word.as_bytes()).all(|(a, b)| same(a, b))
    };
    let contains = |part: &str| {
        key.windows(part.len())
            .any(|w| w.iter().zip(part.as_bytes()).all(|(a, b)| same(a, b)))
    };
    SECRET_KEYS.iter().any(|k| equals(k)) || SECRET_KEY_PARTS.iter().any(|part| contains(part))
}

/// Where the first `temp_url_sig=` (any case) starts at or after `from`. ASCII only matches
/// ASCII, so the position is a char boundary of `text`.
fn find_signature_mark(text: &str, from: usize) -> Option<usize> {
    let mark = TEMP_URL_SIG_MARK.as_bytes();
    text.as_bytes()
        .get(from..)?
        .windows(mark.len())
        .position(|w| w.eq_ignore_ascii_case(mark))
        .map(|at| from + at)
}

/// What precedes a signature's value in a URL.
const TEMP_URL_SIG_MARK: &str = "temp_url_sig=";

/// Whether `c` ends a signature's value: it runs to the next query separator, fragment, space,
/// quote or closing bracket. Signatures are hex, or `<algo>:<base64>`, so none of these is in one.
fn ends_signature(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '&' | '#'
                | '"'
                | '\''
                | '`'
                | '<'
                | '>'
                | '('
                | ')'
                | '['
                | ']'
                | '{'
                | '}'
                | ','
                | ';'
                | '\\'
        )
}

/// `text` with the value of every `temp_url_sig=` (any case) replaced by [`MASK`]; borrowed
/// when there is none.
pub fn signatures(text: &str) -> Cow<'_, str> {
    // No copy of the text unless it holds a signature: the API runs every string of every
    // node it lists through here.
    let Some(first) = find_signature_mark(text, 0) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut next = Some(first);
    while let Some(found) = next {
        let value_start = found + TEMP_URL_SIG_MARK.len();
        let value_len = text[value_start..]
            .find(ends_signature)
            .unwrap_or(text.len() - value_start);
        out.push_str(&text[copied..value_start]);
        if value_len > 0 {
            out.push_str(MASK);
        }
        copied = value_start + value_len;
        next = find_signature_mark(text, copied);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// A URL as a log line or an error may show it: [`signatures`] masked. `url = %Url(&url)`.
#[derive(Clone, Copy)]
pub struct Url<'a>(pub &'a str);

impl fmt::Display for Url<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&signatures(self.0))
    }
}

impl fmt::Debug for Url<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*signatures(self.0), f)
    }
}

/// Masks `value` in place, at any depth: the value of every secret key ([`is_secret_key`])
/// becomes [`MASK`] whole, and every other string has its [`signatures`] masked.
///
/// A secret that is `null`, a boolean or empty stays: it says "not set" (or is a flag such as
/// `agent_secret_token_pregenerated`), which leaks nothing and tells an operator what is missing.
pub fn json(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                let harmless =
                    v.is_null() || v.is_boolean() || v.as_str().is_some_and(str::is_empty);
                if is_secret_key(key) && !harmless {
                    *v = Value::String(MASK.to_owned());
                } else {
                    json(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(json),
        Value::String(s) => {
            if let Cow::Owned(masked) = signatures(s) {
                *s = masked;
            }
        }
        _ => {}
    }
}

/// A copy of `map` masked by [`json`].
pub fn json_map(map: &serde_json::Map<String, Value>) -> Value {
    let mut value = Value::Object(map.clone());
    json(&mut value);
    value
}

/// Free text (a log, `/proc/cmdline`, the kernel's ring buffer) with its secrets masked: every
/// `known` value wherever it shows, the value after every key that names a secret
/// (`ipa-agent-token=…`, `"agent_token": "…"`, `password: …`), and every [`signatures`] value.
pub fn text(text: &str, known: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in known.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret, MASK);
    }
    let out = keyed_values(&out);
    signatures(&out).into_owned()
}

/// Whether `b` may be part of a key in free text.
fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// Masks the value after `key=`, `key: ` and `"key": "` where `key` names a secret. The value
/// is the quoted string when it opens with a quote, else it runs to a space, quote, `,`, `;`,
/// `&`, `}` or the end.
fn keyed_values(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !matches!(bytes[i], b'=' | b':') {
            i += 1;
            continue;
        }
        // The key before the separator: optional spaces and a closing quote, then a key run.
        let mut k = i;
        while k > copied && bytes[k - 1] == b' ' {
            k -= 1;
        }
        if k > copied && matches!(bytes[k - 1], b'"' | b'\'') {
            k -= 1;
        }
        let key_end = k;
        while k > copied && is_key_byte(bytes[k - 1]) {
            k -= 1;
        }
        // All the bytes looked at are ASCII, so these are char boundaries.
        if key_end == k || !is_secret_key(&text[k..key_end]) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let quote = bytes.get(j).copied().filter(|b| matches!(b, b'"' | b'\''));
        if quote.is_some() {
            j += 1;
        }
        let start = j;
        while j < bytes.len() {
            let b = bytes[j];
            let end = match quote {
                Some(q) => b == q || b == b'\n',
                None => {
                    b.is_ascii_whitespace() || matches!(b, b'"' | b'\'' | b',' | b';' | b'&' | b'}')
                }
            };
            if end {
                break;
            }
            j += 1;
        }
        if j > start {
            out.push_str(&text[copied..start]);
            out.push_str(MASK);
            copied = j;
        }
        i = j.max(i + 1);
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn secret_keys_from_every_end() {
        for key in [
            // driver_info, instance_info, driver_internal_info
            "ilo_password",
            "redfish_password",
            "deploy_key",
            "deployment_key",
            "agent_secret_token",
            "configdrive",
            "image_url",
            "swift_temp_url_key",
            "temp_url_info",
            "SNMP_AUTH_KEY",
            "snmp_priv_key",
            "Passwd",
            // the floppy and the kernel command line
            "ipa-agent-token",
            "vmdeploy-iscsi-chap-secret",
            // the conductor's configuration
            "deploy.iscsi_chap_secret",
            "temp_url_key",
            // wire bodies
            "agent_token",
            "temp_url_sig",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "ilo_address",
            "ilo_username",
            "image_source",
            "agent_url",
            "root_gb",
            "ipa-api-url",
            "vmdeploy-iscsi-chap-user",
            "boot_option",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
    }

    #[test]
    fn signatures_are_masked_and_the_rest_of_the_url_stays() {
        for (input, want) in [
            (
                "https://s:8443/v1/AUTH_a/c/o?temp_url_sig=abc123&temp_url_expires=17",
                "https://s:8443/v1/AUTH_a/c/o?temp_url_sig=******&temp_url_expires=17",
            ),
            (
                "http://h/o?temp_url_expires=1&temp_url_sig=sha512:AbC+/x=",
                "http://h/o?temp_url_expires=1&temp_url_sig=******",
            ),
            (
                "GET http://h/a?TEMP_URL_SIG=ff#frag failed (http://h/b?temp_url_sig=ee)",
                "GET http://h/a?TEMP_URL_SIG=******#frag failed (http://h/b?temp_url_sig=******)",
            ),
            (
                "http://h/o?temp_url_sig=&x=1",
                "http://h/o?temp_url_sig=&x=1",
            ),
            ("http://h/img.qcow2", "http://h/img.qcow2"),
            ("ünï temp_url_sig=ßig ö", "ünï temp_url_sig=****** ö"),
            (
                "masked already: temp_url_sig=******&temp_url_expires=1",
                "masked already: temp_url_sig=******&temp_url_expires=1",
            ),
        ] {
            assert_eq!(signatures(input), want, "{input}");
            assert_eq!(Url(input).to_string(), want, "{input}");
        }
        assert!(matches!(signatures("http://h/x?a=b"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_masks_secret_keys_whole_and_signatures_in_place() {
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "driver_info password",
                json!({"ilo_address": "10.0.0.1", "ilo_username": "admin", "ilo_password": "pw"}),
                json!({"ilo_address": "10.0.0.1", "ilo_username": "admin", "ilo_password": MASK}),
            ),
            (
                "driver_internal_info agent token and deploy key, flags kept",
                json!({"agent_secret_token": "tok", "agent_secret_token_pregenerated": true,
                       "deployment_key": "K", "agent_url": "https://10.0.0.2:9999"}),
                json!({"agent_secret_token": MASK, "agent_secret_token_pregenerated": true,
                       "deployment_key": MASK, "agent_url": "https://10.0.0.2:9999"}),
            ),
            (
                "instance_info config drive and image URL, capabilities untouched",
                json!({"configdrive": "H4sI", "image_url": "https://s/x?temp_url_sig=a",
                       "image_source": "http://images/x.qcow2", "capabilities": {"boot_mode": "uefi"}}),
                json!({"configdrive": MASK, "image_url": MASK,
                       "image_source": "http://images/x.qcow2", "capabilities": {"boot_mode": "uefi"}}),
            ),
            (
                "a temp URL under any key, in lists and nested objects",
                json!({"deploy_iso": "https://s/o?temp_url_sig=abc&temp_url_expires=1",
                       "media": [{"url": "https://h/o?temp_url_sig=x"}, "plain"],
                       "deep": {"deeper": {"my_password": "p", "fine": 1}}}),
                json!({"deploy_iso": "https://s/o?temp_url_sig=******&temp_url_expires=1",
                       "media": [{"url": "https://h/o?temp_url_sig=******"}, "plain"],
                       "deep": {"deeper": {"my_password": MASK, "fine": 1}}}),
            ),
            (
                "last_error quoting a URL",
                json!({"last_error": "unable to reach https://s/o?temp_url_sig=live&temp_url_expires=1"}),
                json!({"last_error": "unable to reach https://s/o?temp_url_sig=******&temp_url_expires=1"}),
            ),
            (
                "a secret holding an object is masked whole",
                json!({"temp_url_info": {"key": "k", "url": "u"}}),
                json!({"temp_url_info": MASK}),
            ),
            (
                "unset secrets stay visibly unset",
                json!({"ilo_password": null, "deploy_key": ""}),
                json!({"ilo_password": null, "deploy_key": ""}),
            ),
        ];
        for (name, mut input, want) in cases {
            json(&mut input);
            assert_eq!(input, want, "{name}");
        }
    }

    #[test]
    fn text_masks_known_values_keyed_values_and_signatures() {
        let token = "-Zq8sP3token-Value_0123456789abcdefXYZ";
        let cmdline = format!(
            "BOOT_IMAGE=/vmlinuz ipa-api-url=http://10.0.2.2:6385 ipa-agent-token={token} \
             ipa-debug=1 console=ttyS0"
        );
        let masked = text(&cmdline, &[token]);
        assert!(!masked.contains("Zq8sP3"), "{masked}");
        assert!(masked.contains("ipa-agent-token=******"), "{masked}");
        assert!(
            masked.contains("ipa-api-url=http://10.0.2.2:6385"),
            "{masked}"
        );
        assert!(masked.ends_with("ipa-debug=1 console=ttyS0"), "{masked}");
        // Without being told the value: the key gives it away.
        assert!(!text(&cmdline, &[]).contains("Zq8sP3"));
        for (input, want) in [
            (
                r#"{"agent_token": "abc 123", "x": 1}"#,
                r#"{"agent_token": "******", "x": 1}"#,
            ),
            (
                "GET /v1/commands?agent_token=abc&wait=true",
                "GET /v1/commands?agent_token=******&wait=true",
            ),
            (
                "image_server_password: hunter2\n",
                "image_server_password: ******\n",
            ),
            (
                "deployment_key=K vmdeploy-iscsi-chap-secret=S vmdeploy-iscsi-chap-user=u",
                "deployment_key=****** vmdeploy-iscsi-chap-secret=****** vmdeploy-iscsi-chap-user=u",
            ),
            (
                "url=http://h/o?temp_url_sig=ab12&temp_url_expires=9",
                "url=http://h/o?temp_url_sig=******&temp_url_expires=******",
            ),
            ("Token invalid.", "Token invalid."),
            ("token=", "token="),
            ("ünïcode password=gëheim ö", "ünïcode password=****** ö"),
        ] {
            assert_eq!(text(input, &[]), want, "{input}");
        }
    }

    /// A query string or free text around one signature: what a log line or an error may hold.
    fn around() -> impl Strategy<Value = String> {
        prop_oneof![
            "[ -~]{0,40}",
            "(https?://[a-z.:0-9]{1,20}/[a-zA-Z0-9_/.%-]{0,30}\\?)?([a-z_]{1,12}=[a-zA-Z0-9%+/=._-]{0,16}&){0,3}",
            ".{0,40}",
        ]
    }

    proptest! {
        #[test]
        fn no_signature_survives(
            head in around(),
            tail in around(),
            key in prop_oneof![Just("temp_url_sig"), Just("TEMP_URL_SIG"), Just("Temp_Url_Sig")],
            sig in "(sha(256|512):)?[0-9a-zA-Z+/]{12,64}",
        ) {
            let input = format!("{head}{key}={sig}&temp_url_expires=1{tail}");
            let masked = signatures(&input);
            prop_assert!(!masked.contains(&sig), "{} kept {}", masked, sig);
            prop_assert!(!Url(&input).to_string().contains(&sig));
            prop_assert!(!text(&input, &[]).contains(&sig));
            let mut value = json!({"last_error": input.clone(), "list": [input.clone()]});
            json(&mut value);
            prop_assert!(!value.to_string().contains(&sig));
            // Masking is idempotent: a masked text masks to itself.
            prop_assert_eq!(signatures(&masked), masked.clone());
        }

        #[test]
        fn arbitrary_text_never_panics(input in ".{0,200}", known in "[ -~]{0,8}") {
            let masked = signatures(&input);
            // Every mark left is followed by the mask or by nothing at all.
            let lower = masked.to_ascii_lowercase();
            for (at, mark) in lower.match_indices("temp_url_sig=") {
                let rest = &masked[at + mark.len()..];
                prop_assert!(
                    rest.starts_with(MASK) || rest.chars().next().is_none_or(ends_signature),
                    "{}", masked
                );
            }
            let _ = text(&input, &[known.as_str()]);
            let _ = is_secret_key(&input);
        }

        /// The in-place key check agrees with its definition: lower-case the key, `-` as `_`,
        /// then a whole secret key or a secret fragment anywhere.
        #[test]
        fn secret_keys_as_defined(
            key in prop_oneof![
                "[a-zA-Z_-]{0,24}",
                "[a-z_-]{0,6}(PassWord|TOKEN|deploy-key|temp-url|Secret|ConfigDrive|IMAGE_URL)[a-z_-]{0,6}",
                ".{0,12}",
            ]
        ) {
            let lowered: String = key
                .chars()
                .map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() })
                .collect();
            let defined = SECRET_KEYS.contains(&lowered.as_str())
                || SECRET_KEY_PARTS.iter().any(|part| lowered.contains(part));
            prop_assert_eq!(is_secret_key(&key), defined, "{}", key);
        }
    }
}
