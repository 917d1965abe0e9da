//! Capabilities: `properties.capabilities` (the operator's, `boot_mode:uefi,secure_boot:true`)
//! and `instance_info.capabilities` (the scheduler's, from the flavor), and the boot mode a
//! deploy uses.
//!
//! # Design
//! Ironic takes three spellings and so does [`Capabilities::parse`]: the `k:v,k2:v2` string of
//! `properties` (`ironic/drivers/utils.py:get_node_capability`), a JSON object, and a JSON object
//! encoded as a string, which is how Nova sends `instance_info.capabilities`
//! (`ironic/common/utils.py:parse_instance_info_capabilities`; docs/ironic-protocols.md
//! §5.2). Like Ironic, a `k:v` entry that is not exactly one non-empty key and one non-empty
//! value is skipped, not fatal; [`Capabilities::ignored`] keeps them so validate can say so.
//!
//! [`deploy_boot_mode`] follows Ironic's `boot_mode_utils.get_boot_mode_for_deploy`:
//! `secure_boot:true` in instance_info capabilities means UEFI, `trusted_boot:true` BIOS; else
//! the first set of instance_info `capabilities.boot_mode`, instance_info `deploy_boot_mode`
//! (deprecated there), properties `capabilities.boot_mode`, driver_internal_info
//! `deploy_boot_mode`; and the result must agree with properties' `boot_mode` when that is set,
//! since the operator pinned the node to it.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::drivers::BootMode;
use crate::store::{JsonObject, Node};

/// Why capabilities could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilitiesError {
    /// Not a string or an object.
    #[error("{field} must be a \"key:value,...\" string or a JSON object, not {found}")]
    WrongType {
        /// `properties/capabilities` or `instance_info/capabilities`.
        field: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// A string that starts like JSON but does not parse as an object.
    #[error("{field} is not a valid JSON object: {reason}")]
    BadJson {
        /// The field.
        field: &'static str,
        /// serde_json's message.
        reason: String,
    },
    /// A value that is an array or an object.
    #[error("{field}: capability {key:?} must be a string, a number or a boolean")]
    NestedValue {
        /// The field.
        field: &'static str,
        /// The capability.
        key: String,
    },
    /// A value outside what Ironic accepts for that key.
    #[error("{field}: capability {key} must be one of {allowed}, not {value:?}")]
    BadValue {
        /// The field.
        field: &'static str,
        /// The capability.
        key: &'static str,
        /// What was given.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// The boot mode asked for the instance disagrees with the node's own.
    #[error(
        "boot mode {requested} violates the node's properties/capabilities boot_mode:{pinned}"
    )]
    BootModeConflict {
        /// From instance_info (or driver_internal_info).
        requested: BootMode,
        /// From properties.
        pinned: BootMode,
    },
    /// Secure Boot asked for a deploy that boots in legacy BIOS mode.
    #[error(
        "capabilities ask for secure_boot:true with boot mode bios: UEFI Secure Boot needs \
         boot_mode:uefi (or no boot_mode)"
    )]
    SecureBootNeedsUefi,
}

/// Parsed capabilities: key to value, as strings (Ironic compares them as strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Where they came from, for errors (`properties/capabilities`, ...).
    field: &'static str,
    entries: BTreeMap<String, String>,
    ignored: Vec<String>,
}

impl Default for Capabilities {
    fn default() -> Capabilities {
        Capabilities::empty("capabilities")
    }
}

/// Values Ironic's `deploy_utils.validate_capabilities` accepts, per key.
const KNOWN_VALUES: [(&str, &[&str], &str); 4] = [
    ("boot_mode", &["bios", "uefi"], "bios, uefi"),
    (
        "boot_option",
        &["local", "netboot", "ramdisk"],
        "local, netboot, ramdisk",
    ),
    ("secure_boot", &["true", "false"], "true, false"),
    ("disk_label", &["msdos", "gpt"], "msdos, gpt"),
];

impl Capabilities {
    /// Reads `value` (absent = `Value::Null` = no capabilities); errors call it `capabilities`.
    pub fn parse(value: &Value) -> Result<Capabilities, CapabilitiesError> {
        Self::parse_field("capabilities", value)
    }

    /// Reads `value`, naming it `field` in errors: `properties/capabilities` or
    /// `instance_info/capabilities`.
    pub fn parse_field(
        field: &'static str,
        value: &Value,
    ) -> Result<Capabilities, CapabilitiesError> {
        match value {
            Value::Null => Ok(Capabilities::empty(field)),
            Value::Object(map) => Self::from_object(field, map),
            Value::String(s) if s.trim_start().starts_with('{') => {
                let map: JsonObject =
                    serde_json::from_str(s).map_err(|e| CapabilitiesError::BadJson {
                        field,
                        reason: e.to_string(),
                    })?;
                Self::from_object(field, &map)
            }
            Value::String(s) => Ok(Self::from_pairs(field, s)),
            other => Err(CapabilitiesError::WrongType {
                field,
                found: vmdeploy_shared::json::kind(other),
            }),
        }
    }

    /// The capabilities of a node's `properties`.
    pub fn of_properties(node: &Node) -> Result<Capabilities, CapabilitiesError> {
        Self::parse_field(
            "properties/capabilities",
            node.properties.get("capabilities").unwrap_or(&Value::Null),
        )
    }

    /// The capabilities of a node's `instance_info`.
    pub fn of_instance_info(node: &Node) -> Result<Capabilities, CapabilitiesError> {
        Self::parse_field(
            "instance_info/capabilities",
            node.instance_info
                .get("capabilities")
                .unwrap_or(&Value::Null),
        )
    }

    fn from_object(
        field: &'static str,
        map: &JsonObject,
    ) -> Result<Capabilities, CapabilitiesError> {
        let mut entries = BTreeMap::new();
        for (key, value) in map {
            let text = match value {
                Value::String(s) => s.clone(),
                // Flavor extra specs are strings, but an operator's `{"secure_boot": true}` means
                // the same as "true".
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                Value::Null => continue,
                Value::Array(_) | Value::Object(_) => {
                    return Err(CapabilitiesError::NestedValue {
                        field,
                        key: key.clone(),
                    });
                }
            };
            entries.insert(key.clone(), text);
        }
        Ok(Capabilities {
            field,
            entries,
            ignored: Vec::new(),
        })
    }

    fn empty(field: &'static str) -> Capabilities {
        Capabilities {
            field,
            entries: BTreeMap::new(),
            ignored: Vec::new(),
        }
    }

    fn from_pairs(field: &'static str, s: &str) -> Capabilities {
        let mut caps = Capabilities::empty(field);
        for entry in s.split(',') {
            if entry.trim().is_empty() {
                continue;
            }
            let mut parts = entry.split(':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(key), Some(value), None)
                    if !key.trim().is_empty() && !value.trim().is_empty() =>
                {
                    // The first occurrence wins, as Ironic's lookup returns the first match.
                    caps.entries
                        .entry(key.trim().to_string())
                        .or_insert_with(|| value.trim().to_string());
                }
                _ => caps.ignored.push(entry.to_string()),
            }
        }
        caps
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// Every capability, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// No capability at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `k:v` entries that were skipped because they are malformed (for a validate warning).
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// `boot_mode`, if set (any case).
    pub fn boot_mode(&self) -> Result<Option<BootMode>, CapabilitiesError> {
        self.get("boot_mode")
            .map(|v| parse_boot_mode(self.field, "boot_mode", v))
            .transpose()
    }

    /// `secure_boot:true` (any case).
    pub fn secure_boot(&self) -> bool {
        self.flag("secure_boot")
    }

    /// `trusted_boot:true` (any case).
    pub fn trusted_boot(&self) -> bool {
        self.flag("trusted_boot")
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// Checks the values Ironic checks (`boot_mode`, `boot_option`, `secure_boot`,
    /// `disk_label`), case-insensitively; other keys are free-form (scheduler hints).
    pub fn validate(&self) -> Result<(), CapabilitiesError> {
        let field = self.field;
        for (key, allowed, listed) in KNOWN_VALUES {
            if let Some(value) = self.get(key) {
                if !allowed.iter().any(|a| a.eq_ignore_ascii_case(value)) {
                    return Err(CapabilitiesError::BadValue {
                        field,
                        key,
                        value: value.to_string(),
                        allowed: listed,
                    });
                }
            }
        }
        Ok(())
    }
}

fn parse_boot_mode(
    field: &'static str,
    key: &'static str,
    value: &str,
) -> Result<BootMode, CapabilitiesError> {
    if value.eq_ignore_ascii_case("uefi") {
        Ok(BootMode::Uefi)
    } else if value.eq_ignore_ascii_case("bios") {
        Ok(BootMode::Bios)
    } else {
        Err(CapabilitiesError::BadValue {
            field,
            key,
            value: value.to_string(),
            allowed: "bios, uefi",
        })
    }
}

/// The boot mode a deploy of `node` uses, with Ironic's precedence (module docs), or `None`
/// when nothing sets one (the caller applies its default, or keeps the node's current mode).
pub fn deploy_boot_mode(node: &Node) -> Result<Option<BootMode>, CapabilitiesError> {
    let instance = Capabilities::of_instance_info(node)?;
    if instance.secure_boot() {
        return Ok(Some(BootMode::Uefi));
    }
    if instance.trusted_boot() {
        return Ok(Some(BootMode::Bios));
    }
    let pinned = Capabilities::of_properties(node)?.boot_mode()?;
    let text = |map: &JsonObject, key: &str| {
        map.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let requested = match instance.boot_mode()? {
        Some(mode) => Some(mode),
        None => match text(&node.instance_info, "deploy_boot_mode") {
            Some(v) => Some(parse_boot_mode(
                "instance_info/deploy_boot_mode",
                "deploy_boot_mode",
                &v,
            )?),
            None => match pinned {
                Some(mode) => Some(mode),
                None => text(&node.driver_internal_info, "deploy_boot_mode")
                    .map(|v| {
                        parse_boot_mode(
                            "driver_internal_info/deploy_boot_mode",
                            "deploy_boot_mode",
                            &v,
                        )
                    })
                    .transpose()?,
            },
        },
    };
    match (requested, pinned) {
        (Some(requested), Some(pinned)) if requested != pinned => {
            Err(CapabilitiesError::BootModeConflict { requested, pinned })
        }
        // The node's own secure_boot:true (Ironic's name) means UEFI when nothing else says.
        (None, _) if secure_boot_wanted_by(&instance, node)? => Ok(Some(BootMode::Uefi)),
        _ => Ok(requested),
    }
}

/// Whether a deploy of `node` turns UEFI Secure Boot on before it boots: the instance's
/// `secure_boot` capability when it has one (the scheduler's flavor), else the node's own
/// (`properties.capabilities`). Refused with a boot mode of `bios`, which the operator must
/// hear about at `validate` rather than as a BMC refusal mid-deploy.
pub fn secure_boot_wanted(node: &Node) -> Result<bool, CapabilitiesError> {
    let instance = Capabilities::of_instance_info(node)?;
    let wanted = secure_boot_wanted_by(&instance, node)?;
    if wanted && deploy_boot_mode(node)? == Some(BootMode::Bios) {
        return Err(CapabilitiesError::SecureBootNeedsUefi);
    }
    Ok(wanted)
}

fn secure_boot_wanted_by(instance: &Capabilities, node: &Node) -> Result<bool, CapabilitiesError> {
    Ok(match instance.get("secure_boot") {
        Some(value) => value.eq_ignore_ascii_case("true"),
        None => Capabilities::of_properties(node)?.secure_boot(),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::states::ProvisionState;

    const F: &str = "properties/capabilities";

    fn caps(value: Value) -> Capabilities {
        Capabilities::parse_field(F, &value).expect("parses")
    }

    #[test]
    fn three_spellings_read_the_same() {
        let pairs = caps(json!("boot_mode:uefi,secure_boot:true"));
        let object = caps(json!({"boot_mode": "uefi", "secure_boot": "true"}));
        let encoded = caps(json!(
            "{\"boot_mode\": \"uefi\", \"secure_boot\": \"true\"}"
        ));
        let with_bool = caps(json!({"boot_mode": "uefi", "secure_boot": true}));
        for c in [&pairs, &object, &encoded, &with_bool] {
            assert_eq!(c.get("boot_mode"), Some("uefi"));
            assert!(c.secure_boot());
            assert_eq!(c.boot_mode(), Ok(Some(BootMode::Uefi)));
        }
        assert_eq!(pairs, object);
        assert_eq!(object, encoded);
        // The short form names the field plainly.
        assert_eq!(
            Capabilities::parse(&json!("boot_mode:bios")).and_then(|c| c.boot_mode()),
            Ok(Some(BootMode::Bios))
        );
        let err = Capabilities::parse(&json!({"boot_mode": "efi"}))
            .and_then(|c| c.validate())
            .expect_err("efi is no boot mode");
        assert!(err.to_string().starts_with("capabilities: "), "{err}");
    }

    #[test]
    fn pair_strings_as_ironic_reads_them() {
        for (input, want, ignored) in [
            ("", vec![], vec![]),
            ("boot_mode:bios", vec![("boot_mode", "bios")], vec![]),
            (
                " boot_mode : uefi , x:1 ",
                vec![("boot_mode", "uefi"), ("x", "1")],
                vec![],
            ),
            ("boot_mode:uefi,", vec![("boot_mode", "uefi")], vec![]),
            ("a:1,a:2", vec![("a", "1")], vec![]),
            (
                "a:1,broken,b:2",
                vec![("a", "1"), ("b", "2")],
                vec!["broken"],
            ),
            ("a:b:c,:x,y:", vec![], vec!["a:b:c", ":x", "y:"]),
        ] {
            let c = caps(json!(input));
            assert_eq!(c.iter().collect::<Vec<_>>(), want, "{input:?}");
            assert_eq!(c.ignored(), ignored, "{input:?}");
        }
    }

    #[test]
    fn bad_forms_are_named_errors() {
        for (value, want) in [
            (json!(42), "not a number"),
            (json!(["boot_mode:uefi"]), "not an array"),
            (json!("{boot_mode: uefi}"), "not a valid JSON object"),
            (json!("{\"a\": 1"), "not a valid JSON object"),
            (
                json!({"boot_mode": {"x": 1}}),
                "capability \"boot_mode\" must be",
            ),
        ] {
            let err = Capabilities::parse_field("instance_info/capabilities", &value)
                .expect_err("must fail");
            let msg = err.to_string();
            assert!(msg.starts_with("instance_info/capabilities"), "{msg}");
            assert!(msg.contains(want), "{msg}");
        }
        assert_eq!(
            Capabilities::parse_field(F, &Value::Null),
            Ok(Capabilities::empty(F))
        );
    }

    #[test]
    fn validate_checks_the_known_keys_only() {
        assert_eq!(
            caps(json!(
                "boot_mode:UEFI,boot_option:local,disk_label:gpt,cpu:x86"
            ))
            .validate(),
            Ok(())
        );
        for input in [
            "boot_mode:efi",
            "boot_option:pxe",
            "secure_boot:yes",
            "disk_label:dos",
        ] {
            let err = caps(json!(input)).validate().expect_err(input);
            assert!(
                matches!(err, CapabilitiesError::BadValue { .. }),
                "{input}: {err}"
            );
        }
    }

    fn node(properties: Value, instance: Value, internal: Value) -> Node {
        let mut node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Available);
        let object = |v: Value| match v {
            Value::Object(m) => m,
            _ => JsonObject::new(),
        };
        node.properties = object(properties);
        node.instance_info = object(instance);
        node.driver_internal_info = object(internal);
        node
    }

    #[test]
    fn deploy_boot_mode_precedence_as_ironic() {
        use BootMode::{Bios, Uefi};
        let none = json!({});
        for (name, properties, instance, internal, want) in [
            (
                "nothing set",
                none.clone(),
                none.clone(),
                none.clone(),
                Ok(None),
            ),
            (
                "properties only",
                json!({"capabilities": "boot_mode:uefi"}),
                none.clone(),
                none.clone(),
                Ok(Some(Uefi)),
            ),
            (
                "properties in capitals",
                json!({"capabilities": "boot_mode:BIOS"}),
                none.clone(),
                none.clone(),
                Ok(Some(Bios)),
            ),
            (
                "instance capabilities as Nova's JSON string",
                none.clone(),
                json!({"capabilities": "{\"boot_mode\": \"uefi\"}"}),
                none.clone(),
                Ok(Some(Uefi)),
            ),
            (
                "instance agrees with properties",
                json!({"capabilities": "boot_mode:uefi"}),
                json!({"capabilities": {"boot_mode": "uefi"}}),
                none.clone(),
                Ok(Some(Uefi)),
            ),
            (
                "instance disagrees with properties",
                json!({"capabilities": "boot_mode:bios"}),
                json!({"capabilities": {"boot_mode": "uefi"}}),
                none.clone(),
                Err(CapabilitiesError::BootModeConflict {
                    requested: Uefi,
                    pinned: Bios,
                }),
            ),
            (
                "secure boot means uefi and wins",
                json!({"capabilities": "boot_mode:bios"}),
                json!({"capabilities": {"boot_mode": "bios", "secure_boot": "True"}}),
                none.clone(),
                Ok(Some(Uefi)),
            ),
            (
                "trusted boot means bios",
                none.clone(),
                json!({"capabilities": {"trusted_boot": "true"}}),
                none.clone(),
                Ok(Some(Bios)),
            ),
            (
                "deprecated instance_info deploy_boot_mode",
                none.clone(),
                json!({"deploy_boot_mode": "uefi"}),
                json!({"deploy_boot_mode": "bios"}),
                Ok(Some(Uefi)),
            ),
            (
                "properties over driver_internal_info",
                json!({"capabilities": "boot_mode:uefi"}),
                none.clone(),
                json!({"deploy_boot_mode": "bios"}),
                Ok(Some(Uefi)),
            ),
            (
                "driver_internal_info last",
                none.clone(),
                none.clone(),
                json!({"deploy_boot_mode": "bios"}),
                Ok(Some(Bios)),
            ),
            (
                "unknown mode",
                json!({"capabilities": "boot_mode:efi"}),
                none.clone(),
                none.clone(),
                Err(CapabilitiesError::BadValue {
                    field: F,
                    key: "boot_mode",
                    value: "efi".into(),
                    allowed: "bios, uefi",
                }),
            ),
        ] {
            assert_eq!(
                deploy_boot_mode(&node(properties, instance, internal)),
                want,
                "{name}"
            );
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[a-z_:,{}\" ]{0,24}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{0,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn arbitrary_json_never_panics(
            properties in any_json(),
            instance in any_json(),
            internal in any_json(),
        ) {
            let _ = Capabilities::parse_field(F, &properties).map(|c| c.validate());
            let mut n = node(json!({}), json!({}), json!({}));
            n.properties.insert("capabilities".into(), properties);
            n.instance_info.insert("capabilities".into(), instance.clone());
            n.instance_info.insert("deploy_boot_mode".into(), instance);
            n.driver_internal_info.insert("deploy_boot_mode".into(), internal);
            let _ = deploy_boot_mode(&n);
        }

        #[test]
        fn pairs_round_trip(
            entries in prop::collection::btree_map("[a-z_]{1,8}", "[a-zA-Z0-9_.-]{1,8}", 0..6),
        ) {
            let text = entries
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>()
                .join(",");
            let c = caps(json!(text));
            prop_assert!(c.ignored().is_empty());
            let read: BTreeMap<String, String> =
                c.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            prop_assert_eq!(read, entries);
        }
    }
}
