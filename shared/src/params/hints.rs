//! Root device hints (`root_device`): which disk to deploy to.
//!
//! # Design
//! One rule set for both forms the hints take: Ironic's `properties.root_device` object, which
//! the conductor reads to write the floppy and the agent reads from its lookup
//! ([`RootDeviceHints::from_json`]), and the floppy's `k=v,k=v` text
//! ([`RootDeviceHints::parse`], [`RootDeviceHints::render`]). Every value goes through one
//! function, so the two ends cannot disagree about what a hint means.
//!
//! The rules follow Ironic's root device hints (docs/ironic-protocols.md §1.2, §1.4): a value is
//! trimmed and, except `name`, lowercased; it may contain spaces (HP Smart Array disks are
//! `LOGICAL VOLUME`); `size` is a positive whole number of GiB. An expression whose first word
//! is one of Ironic's operators is read as Ironic reads it: the equality operators (`== 100` for
//! `size`, `s== text` for the others) mean the plain value; every other operator (`>=`, `!=`,
//! `s!=`, `<in>`, `<or>`, ... and the legacy `=`, which Ironic reads as "at least") is refused by
//! name, since the agent matches plain values and guessing could pick the wrong disk.
//!
//! # Limitations
//! Ironic's `rotational`, `hctl`, `by_path`, `wwn_with_extension` and `wwn_vendor_extension`
//! hints are refused as unsupported.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use super::{cut, ParamsError};

/// Root device hints (`root_device`): which disk to deploy to.
///
/// Values are trimmed and, except `name`, lowercased (IPA compares them case-insensitively);
/// `size` is in GiB.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootDeviceHints {
    /// Size in GiB (whole GiB, as Ironic computes it: bytes / 2^30 rounded down).
    pub size_gib: Option<u64>,
    /// Disk model, lowercased.
    pub model: Option<String>,
    /// Disk vendor, lowercased.
    pub vendor: Option<String>,
    /// Serial number, lowercased.
    pub serial: Option<String>,
    /// World wide name, lowercased.
    pub wwn: Option<String>,
    /// Device name, e.g. `/dev/sda` or `sda`.
    pub name: Option<String>,
}

/// The hints this project matches, for error messages.
const SUPPORTED: &str = "size, model, vendor, serial, wwn, name";

/// Hints Ironic knows that the agent does not match.
const IRONIC_ONLY: &[&str] = &[
    "rotational",
    "hctl",
    "by_path",
    "wwn_with_extension",
    "wwn_vendor_extension",
];

/// Ironic's hint operators: an expression whose first word is one of these is an operator
/// expression (Ironic lowercases expressions first, so `S==` is `s==`).
const OPERATORS: &[&str] = &[
    "=", "==", "!=", ">=", ">", "<=", "<", "s==", "s!=", "s>=", "s>", "s<=", "s<", "<in>",
    "<all-in>", "<or>",
];

/// The hints this project matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HintKind {
    Size,
    Model,
    Vendor,
    Serial,
    Wwn,
    Name,
}

/// The hint `key` names; a hint this project does not match is refused.
fn hint_kind(key: &str) -> Result<HintKind, ParamsError> {
    let why = match key {
        "size" => return Ok(HintKind::Size),
        "model" => return Ok(HintKind::Model),
        "vendor" => return Ok(HintKind::Vendor),
        "serial" => return Ok(HintKind::Serial),
        "wwn" => return Ok(HintKind::Wwn),
        "name" => return Ok(HintKind::Name),
        k if IRONIC_ONLY.contains(&k) => "this hint is not supported",
        _ => "unknown hint",
    };
    Err(ParamsError::Hints(format!(
        "{}: {why} (supported: {SUPPORTED})",
        cut(key)
    )))
}

/// The value `expression` stands for: trimmed, with a leading `equality` operator (`==` or
/// `s==`) taken off; any other operator is refused.
fn plain_value(expression: &str, equality: &str) -> Result<String, String> {
    let expression = expression.trim();
    let mut words = expression.split_whitespace();
    let value = match words.next() {
        None => return Err("empty value".into()),
        Some(first) if first.to_lowercase() == equality => expression[first.len()..].trim_start(),
        Some(_) => expression,
    };
    if let Some(op) = value
        .split_whitespace()
        .map(str::to_lowercase)
        .find(|w| OPERATORS.contains(&w.as_str()))
    {
        return Err(format!(
            "operator {op:?} is not supported in {:?}: give a plain value (or `{equality} value`)",
            cut(expression)
        ));
    }
    if value.is_empty() {
        return Err(format!("no value after {equality:?}"));
    }
    Ok(value.to_owned())
}

/// Characters left unencoded in rendered hint values: RFC 3986 unreserved, as Python's `quote`.
const HINT_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

impl RootDeviceHints {
    /// Parses the floppy's `k=v,k=v` (values percent-encoded). Unknown hints are errors: guessing
    /// could pick the wrong disk.
    pub fn parse(value: &str) -> Result<Self, ParamsError> {
        let mut hints = RootDeviceHints::default();
        for item in value.split(',').filter(|s| !s.trim().is_empty()) {
            let Some((key, raw)) = item.split_once('=') else {
                return Err(ParamsError::Hints(format!(
                    "expected hint=value, found {:?}",
                    cut(item)
                )));
            };
            let key = key.trim();
            let decoded = percent_decode_str(raw)
                .decode_utf8()
                .map_err(|_| ParamsError::Hints(format!("value of {:?} is not UTF-8", cut(key))))?;
            hints.set(key, &decoded)?;
        }
        if hints == RootDeviceHints::default() {
            return Err(ParamsError::Hints("no hints given".into()));
        }
        Ok(hints)
    }

    /// Reads Ironic's `properties.root_device` object; `None` when it is absent (`null`) or
    /// empty, as Ironic treats an empty object. `size` may be a JSON number or a string, the
    /// other hints must be strings (Ironic refuses anything else).
    pub fn from_json(value: &Value) -> Result<Option<Self>, ParamsError> {
        let obj = match value {
            Value::Null => return Ok(None),
            Value::Object(o) if o.is_empty() => return Ok(None),
            Value::Object(o) => o,
            other => {
                return Err(ParamsError::Hints(format!(
                    "expected an object of hints, found {}",
                    crate::json::kind(other)
                )))
            }
        };
        let mut hints = RootDeviceHints::default();
        for (key, value) in obj {
            let number;
            let text = match value {
                Value::String(s) => s.as_str(),
                Value::Number(n) if key == "size" => {
                    number = n.to_string();
                    number.as_str()
                }
                other => {
                    hint_kind(key)?;
                    let want = if key == "size" {
                        "a whole number of GiB"
                    } else {
                        "a string"
                    };
                    return Err(ParamsError::Hints(format!(
                        "{}: must be {want}, found {}",
                        cut(key),
                        crate::json::kind(other)
                    )));
                }
            };
            hints.set(key, text)?;
        }
        Ok(Some(hints))
    }

    /// Sets hint `key` from `expression`: the one place the value rules live.
    fn set(&mut self, key: &str, expression: &str) -> Result<(), ParamsError> {
        let kind = hint_kind(key)?;
        let bad = |why: String| ParamsError::Hints(format!("{}: {why}", cut(key)));
        let slot = match kind {
            HintKind::Size => None,
            HintKind::Model => Some(&mut self.model),
            HintKind::Vendor => Some(&mut self.vendor),
            HintKind::Serial => Some(&mut self.serial),
            HintKind::Wwn => Some(&mut self.wwn),
            HintKind::Name => Some(&mut self.name),
        };
        let equality = if slot.is_none() { "==" } else { "s==" };
        let value = plain_value(expression, equality).map_err(bad)?;
        let Some(slot) = slot else {
            let size = value
                .parse::<u64>()
                .ok()
                .filter(|&gib| gib > 0)
                .ok_or_else(|| {
                    bad(format!(
                        "must be a positive whole number of GiB, found {:?}",
                        cut(&value)
                    ))
                })?;
            if self.size_gib.replace(size).is_some() {
                return Err(bad("given twice".into()));
            }
            return Ok(());
        };
        let value = if kind == HintKind::Name {
            value
        } else {
            value.to_lowercase()
        };
        if slot.replace(value).is_some() {
            return Err(bad("given twice".into()));
        }
        Ok(())
    }

    /// Renders `k=v,k=v` with percent-encoded values, in a fixed order.
    pub fn render(&self) -> String {
        let mut parts = Vec::new();
        if let Some(size) = self.size_gib {
            parts.push(format!("size={size}"));
        }
        let text = [
            ("model", &self.model),
            ("vendor", &self.vendor),
            ("serial", &self.serial),
            ("wwn", &self.wwn),
            ("name", &self.name),
        ];
        for (key, value) in text {
            if let Some(v) = value {
                parts.push(format!("{key}={}", utf8_percent_encode(v, HINT_ENCODE)));
            }
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn root_device_hints_round_trip_and_reject_unknown() {
        let hints = RootDeviceHints::parse("size=20,vendor=HP%20Inc,wwn=0x5000C5,name=/dev/sda")
            .expect("valid hints");
        assert_eq!(hints.vendor.as_deref(), Some("hp inc"));
        assert_eq!(hints.name.as_deref(), Some("/dev/sda"));
        assert_eq!(RootDeviceHints::parse(&hints.render()), Ok(hints));
        for bad in [
            "size=big",
            "size=0",
            "colour=red",
            "model",
            "size=1,size=2",
            "",
            "model=%20",
            "size=%3E%3D%2010",
        ] {
            assert!(RootDeviceHints::parse(bad).is_err(), "{bad}");
        }
    }

    fn from_json(v: Value) -> Result<Option<RootDeviceHints>, String> {
        RootDeviceHints::from_json(&v).map_err(|e| e.to_string())
    }

    /// The cases where the agent's and the conductor's parsers used to disagree.
    #[test]
    fn ironic_objects_follow_one_rule_set() {
        let model = |m: &str| RootDeviceHints {
            model: Some(m.into()),
            ..Default::default()
        };
        let size = |g: u64| RootDeviceHints {
            size_gib: Some(g),
            ..Default::default()
        };
        let ok: &[(Value, Option<RootDeviceHints>)] = &[
            // Spaces inside a value: HP Smart Array's logical drives.
            (
                json!({"model": " LOGICAL VOLUME "}),
                Some(model("logical volume")),
            ),
            // Equality operators mean the plain value.
            (
                json!({"model": "s== LOGICAL VOLUME"}),
                Some(model("logical volume")),
            ),
            (
                json!({"model": "S==  Logical Volume"}),
                Some(model("logical volume")),
            ),
            (json!({"size": "== 100"}), Some(size(100))),
            (json!({"size": 100}), Some(size(100))),
            (json!({"size": " 100 "}), Some(size(100))),
            // No hints: Ironic's empty object.
            (json!({}), None),
            (Value::Null, None),
            (
                json!({"name": "/dev/SDA", "serial": "S123", "wwn": "0x5000C5"}),
                Some(RootDeviceHints {
                    name: Some("/dev/SDA".into()),
                    serial: Some("s123".into()),
                    wwn: Some("0x5000c5".into()),
                    ..Default::default()
                }),
            ),
        ];
        for (v, want) in ok {
            assert_eq!(from_json(v.clone()).as_ref(), Ok(want), "{v}");
        }
        let refused: &[(Value, &str)] = &[
            (json!({"size": ">= 10"}), "operator \">=\""),
            (json!({"size": "= 10"}), "operator \"=\""),
            (json!({"size": "s== 10"}), "operator \"s==\""),
            (json!({"serial": "s!= x"}), "operator \"s!=\""),
            (json!({"model": "== x"}), "operator \"==\""),
            (json!({"vendor": "<or> hp <or> dell"}), "operator \"<or>\""),
            (json!({"vendor": "hp <or> dell"}), "operator \"<or>\""),
            (json!({"model": "<in> samsung"}), "operator \"<in>\""),
            (json!({"model": "s=="}), "no value"),
            (json!({"model": "  "}), "empty value"),
            (json!({"size": 0}), "positive whole number"),
            (json!({"size": -1}), "positive whole number"),
            (json!({"size": 10.5}), "positive whole number"),
            (json!({"size": "ten"}), "positive whole number"),
            (json!({"size": true}), "must be a whole number of GiB"),
            (json!({"serial": 123}), "must be a string"),
            (json!({"rotational": true}), "not supported"),
            (json!({"hctl": "1:0:0:0"}), "not supported"),
            (json!({"colour": "red"}), "colour: unknown hint"),
            (json!("sda"), "expected an object"),
        ];
        for (v, text) in refused {
            match from_json(v.clone()) {
                Err(e) => assert!(e.contains(text), "{v}: {e}"),
                Ok(h) => panic!("{v}: accepted as {h:?}"),
            }
        }
    }

    /// Keys: the supported ones, one Ironic-only and one unknown. Values: words, spaces,
    /// operators, percent signs, commas and non-ASCII letters.
    fn hint_object() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(vec![
            "size", "model", "vendor", "serial", "wwn", "name", "hctl", "x",
        ]);
        let text = "(s?==? |<or> |<in> |>= )?[a-zA-Z0-9 ,%=<>_.İß/-]{0,12}";
        let value = prop_oneof![
            text.prop_map(Value::String),
            any::<u32>().prop_map(|n| json!(n)),
            any::<bool>().prop_map(Value::Bool),
        ];
        prop::collection::btree_map(key, value, 0..5)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
    }

    proptest! {
        #[test]
        fn hints_parser_never_panics(s in "\\PC{0,80}") {
            let _ = RootDeviceHints::parse(&s);
        }

        #[test]
        fn hints_parser_never_panics_on_hint_like_text(s in "[a-z=,%0-9A-F <>!]{0,80}") {
            let _ = RootDeviceHints::parse(&s);
        }

        /// Whatever the conductor accepts from Ironic's object reaches the agent unchanged
        /// through the floppy.
        #[test]
        fn accepted_objects_survive_render_and_parse(v in hint_object()) {
            if let Ok(Some(hints)) = RootDeviceHints::from_json(&v) {
                prop_assert_eq!(RootDeviceHints::parse(&hints.render()), Ok(hints));
            }
        }
    }
}
