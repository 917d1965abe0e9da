//! Serde types of the HTTP APIs between the agent and the conductor.
//!
//! Types only: the servers and clients that move them live in `conductor/src/api` and
//! `agent/src/api`. Each body that comes from the network has a `validate` that turns it into a
//! checked form, with an error message an operator can act on.

use std::net::IpAddr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::iqn;
use crate::secret::Secret;

pub mod clean;
pub mod ipa;

/// What is wrong with a request body.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    /// A required field is absent or empty.
    #[error("field {0:?} is required")]
    MissingField(&'static str),
    /// A field has the wrong form.
    #[error("field {field:?}: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A field holds a JSON value of the wrong type (a number where text is expected).
    #[error("field {field:?}: {reason}")]
    WrongType {
        /// The field, as a path from the body's top (`key`, `a.b`).
        field: String,
        /// What serde found instead of what it expected.
        reason: String,
    },
    /// The body is not the JSON expected.
    #[error("malformed JSON body: {0}")]
    Json(String),
}

/// Reads a call-back body that is already JSON (the conductor's API has parsed it) into its
/// wire type, naming the field whose value has the wrong type: serde's own message names only
/// the type, and an operator reading a 400 needs the field.
pub fn from_value<T: DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(naming_the_field)
}

/// [`from_value`] for the body's bytes.
pub fn from_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut json = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut json).map_err(naming_the_field)
}

fn naming_the_field(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let field = e.path().to_string();
    let inner = e.into_inner();
    // A path of "." is the body itself: not JSON, not an object, or a required field absent
    // (serde's message names that field).
    if field == "." || !inner.is_data() {
        ApiError::Json(inner.to_string())
    } else {
        ApiError::WrongType {
            field: field.chars().take(64).collect(),
            reason: inner.to_string(),
        }
    }
}

/// `POST {ironic_api_url}/v1/nodes/{uuid}/vendor_passthru/pass_deploy_info`, sent by the agent
/// once the node's disk is exposed over iSCSI (`docs/ironic-protocols.md` §2.2 step 5).
///
/// Fields are as the DIB ramdisk sends them; `error` is empty or absent on success. The key
/// goes on the wire as it is (the conductor checks it) and is masked everywhere else.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PassDeployInfo {
    /// The agent's IP address (the iSCSI portal's host).
    #[serde(default)]
    pub address: String,
    /// The one-time deploy key from the floppy.
    #[serde(default, serialize_with = "crate::secret::serialize_exposed")]
    pub key: Secret,
    /// The target name the disk is served under.
    #[serde(default)]
    pub iqn: String,
    /// The first error the agent met, or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A checked [`PassDeployInfo`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidPassDeployInfo {
    /// The agent's address.
    pub address: IpAddr,
    /// The deploy key (compared in constant time by `Secret`'s `PartialEq`).
    pub key: Secret,
    /// The target name.
    pub iqn: String,
    /// The agent's error, if it reported one.
    pub error: Option<String>,
}

/// Longest `error` text kept from an agent; longer ones are cut (the conductor stores it in
/// `last_error`).
pub const MAX_AGENT_ERROR_LEN: usize = 4096;

impl PassDeployInfo {
    /// Parses a JSON body.
    pub fn from_json(body: &[u8]) -> Result<Self, ApiError> {
        from_json(body)
    }

    /// Checks every field: `key` non-empty, `address` an IP address, `iqn` an iSCSI name (RFC
    /// 3720 or Ironic's `iqn-<uuid>`). An agent that reports an error may leave `address` and
    /// `iqn` empty: it has nothing to serve.
    pub fn validate(&self) -> Result<ValidPassDeployInfo, ApiError> {
        if self.key.expose().is_empty() {
            return Err(ApiError::MissingField("key"));
        }
        let error = self
            .error
            .as_deref()
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| e.chars().take(MAX_AGENT_ERROR_LEN).collect::<String>());
        let address = match (self.address.trim(), &error) {
            ("", Some(_)) => IpAddr::from([0, 0, 0, 0]),
            ("", None) => return Err(ApiError::MissingField("address")),
            (a, _) => a.parse().map_err(|_| ApiError::InvalidField {
                field: "address",
                reason: format!(
                    "{:?} is not an IP address",
                    a.chars().take(64).collect::<String>()
                ),
            })?,
        };
        if self.iqn.is_empty() {
            if error.is_none() {
                return Err(ApiError::MissingField("iqn"));
            }
        } else {
            iqn::validate(&self.iqn).map_err(|e| ApiError::InvalidField {
                field: "iqn",
                reason: e.to_string(),
            })?;
        }
        Ok(ValidPassDeployInfo {
            address,
            key: self.key.clone(),
            iqn: self.iqn.clone(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body(address: &str, key: &str, iqn: &str, error: &str) -> Vec<u8> {
        serde_json::json!({"address": address, "key": key, "iqn": iqn, "error": error})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn a_good_body_validates() {
        let info = PassDeployInfo::from_json(&body(
            "10.0.2.15",
            "ABC123",
            "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            "",
        ))
        .expect("JSON");
        let valid = info.validate().expect("valid");
        assert_eq!(valid.address, "10.0.2.15".parse::<IpAddr>().expect("ip"));
        assert_eq!(valid.error, None);
        assert_eq!(valid.key.expose(), "ABC123");
        assert!(!format!("{valid:?}").contains("ABC123"), "key masked");
        assert!(
            !format!("{info:?} {info:#?}").contains("ABC123"),
            "key masked"
        );
    }

    #[test]
    fn the_wire_body_carries_the_key_and_debug_does_not() {
        let info = PassDeployInfo {
            address: "10.0.2.15".into(),
            key: Secret::new("0123456789ABCDEF"),
            iqn: "iqn-x".into(),
            error: None,
        };
        let wire = serde_json::to_value(&info).expect("json");
        assert_eq!(
            wire,
            serde_json::json!({"address": "10.0.2.15", "key": "0123456789ABCDEF", "iqn": "iqn-x"})
        );
        assert!(!format!("{info:?}").contains("0123456789ABCDEF"));
        let back = PassDeployInfo::from_json(wire.to_string().as_bytes()).expect("parse");
        assert_eq!(back, info);
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (
                body("10.0.0.1", "", "iqn-x", ""),
                ApiError::MissingField("key"),
            ),
            (
                body("", "k", "iqn-x", ""),
                ApiError::MissingField("address"),
            ),
            (body("10.0.0.1", "k", "", ""), ApiError::MissingField("iqn")),
        ];
        for (input, expected) in cases {
            let got = PassDeployInfo::from_json(&input).expect("JSON").validate();
            assert_eq!(got, Err(expected));
        }
        let got = PassDeployInfo::from_json(&body("node-1", "k", "iqn-x", ""))
            .expect("JSON")
            .validate();
        assert!(
            matches!(
                got,
                Err(ApiError::InvalidField {
                    field: "address",
                    ..
                })
            ),
            "{got:?}"
        );
        let got = PassDeployInfo::from_json(&body("::1", "k", "target", ""))
            .expect("JSON")
            .validate();
        assert!(
            matches!(got, Err(ApiError::InvalidField { field: "iqn", .. })),
            "{got:?}"
        );
        // serde reads a struct from a list too: the truncated list fails on its first item.
        assert!(PassDeployInfo::from_json(b"[1,2").is_err());
        assert_eq!(
            PassDeployInfo::from_json(br#"{"key": 5}"#),
            Err(ApiError::WrongType {
                field: "key".into(),
                reason: "invalid type: integer `5`, expected a string at line 1 column 9".into(),
            })
        );
        let err = from_value::<PassDeployInfo>(serde_json::json!({"address": ["10.0.0.1"]}))
            .expect_err("a list is no address");
        assert_eq!(
            err.to_string(),
            "field \"address\": invalid type: sequence, expected a string"
        );
        assert!(from_value::<PassDeployInfo>(serde_json::json!([1])).is_err());
    }

    #[test]
    fn fields_are_named_as_the_ramdisk_names_them() {
        // The DIB ramdisk's body (docs/ironic-protocols.md §2.2 step 5), every field spelled
        // out here so a renamed struct field cannot pass both ends.
        let wire = serde_json::json!({
            "address": "10.0.2.15",
            "key": "0123456789abcdef",
            "iqn": "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            "error": "no disk",
        });
        let info: PassDeployInfo = from_value(wire.clone()).expect("parse");
        assert_eq!(serde_json::to_value(&info).expect("json"), wire);
        let valid = info.validate().expect("valid");
        assert_eq!(valid.address, IpAddr::from([10, 0, 2, 15]));
        assert_eq!(valid.key.expose(), "0123456789abcdef");
        assert_eq!(valid.iqn, "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123");
        assert_eq!(valid.error.as_deref(), Some("no disk"));
    }

    #[test]
    fn an_agent_error_needs_no_address() {
        let info = PassDeployInfo::from_json(&body("", "k", "", "no disk matches the hints"))
            .expect("JSON");
        let valid = info.validate().expect("an error report is valid");
        assert_eq!(valid.error.as_deref(), Some("no disk matches the hints"));
    }

    #[test]
    fn missing_error_field_is_success() {
        let info = PassDeployInfo::from_json(
            br#"{"address":"::1","key":"k","iqn":"iqn.2024-01.org.x:y"}"#,
        )
        .expect("JSON");
        assert_eq!(info.validate().expect("valid").error, None);
    }

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(info) = PassDeployInfo::from_json(&bytes) {
                let _ = info.validate();
            }
        }

        #[test]
        fn arbitrary_fields_never_panic(a in "\\PC{0,40}", k in "\\PC{0,10}", i in "\\PC{0,40}", e in "\\PC{0,20}") {
            let _ = PassDeployInfo { address: a, key: Secret::new(k), iqn: i, error: Some(e) }.validate();
        }
    }
}
