//! JSON Patch (RFC 6902) as Ironic takes it (docs/ironic-protocols.md §5.2, `types.JsonPatchType`): a list of
//! `{"op": "add"|"replace"|"remove", "path": "/a/b", "value": ...}`, paths matching
//! `^(/[\w-]+)+$`, read-only roots refused with 400 naming the field, mandatory ones never
//! removed.
//!
//! # Design
//! A patch is parsed ([`parse`]), its roots checked against the resource's [`Rules`], then
//! applied to the resource's JSON document ([`apply`]); the caller reads the fields back with
//! its own type checks. Removing a root field resets it (null), as Ironic does.

use serde_json::{Map, Value};

use super::body::{cut, type_name};
use super::error::ApiError;

/// Most operations in one patch (a patch of a whole `instance_info` is a few dozen).
const MAX_OPS: usize = 1000;

/// An operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// `add`: set a member (or insert into a list).
    Add,
    /// `replace`: set a member that exists.
    Replace,
    /// `remove`: delete a member that exists.
    Remove,
}

/// One operation of a patch.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PatchOp {
    /// What to do.
    pub op: Op,
    /// The path as given.
    pub path: String,
    /// Its tokens (`/driver_info/ilo_address` → `driver_info`, `ilo_address`).
    pub tokens: Vec<String>,
    /// The value of `add` and `replace`.
    pub value: Value,
}

impl PatchOp {
    /// The top-level field it changes.
    pub fn root(&self) -> &str {
        &self.tokens[0]
    }
}

/// Which top-level fields of a resource a patch may touch.
pub(super) struct Rules<'a> {
    /// Fields a patch may change.
    pub writable: &'a [&'a str],
    /// Fields that exist but only the conductor writes (400 "internal attribute").
    pub read_only: &'a [&'a str],
    /// Writable fields that may not be removed.
    pub mandatory: &'a [&'a str],
    /// `node` or `port`, for messages.
    pub kind: &'a str,
}

fn valid_path(path: &str) -> bool {
    // `^(/[\w-]+)+$`: a slash, then word characters or dashes, repeated.
    path.starts_with('/')
        && path[1..].split('/').all(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        })
}

/// Parses a patch body.
pub(super) fn parse(body: Value) -> Result<Vec<PatchOp>, ApiError> {
    let Value::Array(items) = body else {
        return Err(ApiError::bad_request(format!(
            "The request body of a PATCH must be a JSON Patch list of operations, not {}.",
            type_name(&body)
        )));
    };
    if items.len() > MAX_OPS {
        return Err(ApiError::bad_request(format!(
            "A patch may hold at most {MAX_OPS} operations."
        )));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse_op(i, item))
        .collect()
}

fn parse_op(index: usize, item: Value) -> Result<PatchOp, ApiError> {
    let Value::Object(mut obj) = item else {
        return Err(ApiError::bad_request(format!(
            "Patch operation {index} must be an object with \"op\" and \"path\", not {}.",
            type_name(&item)
        )));
    };
    let op = match obj.get("op") {
        Some(Value::String(s)) => match s.as_str() {
            "add" => Op::Add,
            "replace" => Op::Replace,
            "remove" => Op::Remove,
            other => {
                return Err(ApiError::bad_request(format!(
                    "Invalid value for field \"op\" of patch operation {index}: {:?} (expected \
                     add, replace or remove).",
                    cut(other)
                )))
            }
        },
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for field \"op\" of patch operation {index}: expected a string, \
                 got {}.",
                type_name(other)
            )))
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "Mandatory field \"op\" is missing in patch operation {index}."
            )))
        }
    };
    let path = match obj.get("path") {
        Some(Value::String(s)) if valid_path(s) => s.clone(),
        Some(Value::String(s)) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for field \"path\" of patch operation {index}: {:?} does not \
                 match ^(/[\\w-]+)+$.",
                cut(s)
            )))
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for field \"path\" of patch operation {index}: expected a \
                 string, got {}.",
                type_name(other)
            )))
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "Mandatory field \"path\" is missing in patch operation {index}."
            )))
        }
    };
    let value = match (op, obj.remove("value")) {
        (Op::Remove, _) => Value::Null,
        (_, Some(v)) => v,
        (_, None) => {
            return Err(ApiError::bad_request(format!(
                "Mandatory field \"value\" is missing in patch operation {index} ({path})."
            )))
        }
    };
    let tokens = path[1..].split('/').map(String::from).collect();
    Ok(PatchOp {
        op,
        path,
        tokens,
        value,
    })
}

/// Refuses operations on fields the resource does not let a patch change.
pub(super) fn check(ops: &[PatchOp], rules: &Rules) -> Result<(), ApiError> {
    for op in ops {
        let root = op.root();
        if rules.read_only.contains(&root) {
            return Err(ApiError::bad_request(format!(
                "'/{root}' is an internal attribute and can not be updated"
            )));
        }
        if !rules.writable.contains(&root) {
            return Err(ApiError::bad_request(format!(
                "Unknown attribute '/{}' for {}: it can not be patched.",
                cut(root),
                rules.kind
            )));
        }
        if op.op == Op::Remove && op.tokens.len() == 1 && rules.mandatory.contains(&root) {
            return Err(ApiError::bad_request(format!(
                "'/{root}' is a mandatory attribute and can not be removed"
            )));
        }
    }
    Ok(())
}

/// Applies `ops` in order to `doc` (an object).
pub(super) fn apply(doc: &mut Value, ops: &[PatchOp]) -> Result<(), ApiError> {
    for op in ops {
        apply_one(doc, op)?;
    }
    Ok(())
}

fn apply_one(doc: &mut Value, op: &PatchOp) -> Result<(), ApiError> {
    let (last, parents) = op
        .tokens
        .split_last()
        .ok_or_else(|| ApiError::bad_request("A patch path may not be empty."))?;
    let missing = || {
        ApiError::bad_request(format!(
            "Can not apply patch: the path {} does not exist.",
            cut(&op.path)
        ))
    };
    // Root fields always exist in the document: `remove` resets them, `add` sets them.
    if parents.is_empty() {
        let Value::Object(map) = doc else {
            return Err(missing());
        };
        match op.op {
            Op::Add | Op::Replace => {
                map.insert(last.clone(), op.value.clone());
            }
            Op::Remove => {
                map.insert(last.clone(), Value::Null);
            }
        }
        return Ok(());
    }
    let mut target = &mut *doc;
    for token in parents {
        target = match target {
            Value::Object(map) => map.get_mut(token).ok_or_else(missing)?,
            Value::Array(items) => {
                let i = index(token, items.len(), false).ok_or_else(missing)?;
                &mut items[i]
            }
            _ => return Err(missing()),
        };
        // `add` into a field that is null (an empty dict field reset by `remove`): start it.
        if target.is_null() && op.op == Op::Add {
            *target = Value::Object(Map::new());
        }
    }
    match target {
        Value::Object(map) => match op.op {
            Op::Add => {
                map.insert(last.clone(), op.value.clone());
            }
            Op::Replace => {
                let slot = map.get_mut(last).ok_or_else(missing)?;
                *slot = op.value.clone();
            }
            Op::Remove => {
                map.remove(last).ok_or_else(missing)?;
            }
        },
        Value::Array(items) => match op.op {
            Op::Add => {
                let i = index(last, items.len(), true).ok_or_else(missing)?;
                items.insert(i, op.value.clone());
            }
            Op::Replace => {
                let i = index(last, items.len(), false).ok_or_else(missing)?;
                items[i] = op.value.clone();
            }
            Op::Remove => {
                let i = index(last, items.len(), false).ok_or_else(missing)?;
                items.remove(i);
            }
        },
        _ => return Err(missing()),
    }
    Ok(())
}

/// A list index token: a number below `len` (or equal to it, or `-`, when inserting).
fn index(token: &str, len: usize, inserting: bool) -> Option<usize> {
    if inserting && token == "-" {
        return Some(len);
    }
    if token.len() > 1 && token.starts_with('0') {
        return None;
    }
    let i: usize = token.parse().ok()?;
    if i < len || (inserting && i == len) {
        Some(i)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RULES: Rules<'static> = Rules {
        writable: &["driver", "driver_info", "instance_info", "extra", "name"],
        read_only: &["uuid", "provision_state", "driver_internal_info"],
        mandatory: &["driver"],
        kind: "node",
    };

    fn run(doc: Value, patch: Value) -> Result<Value, ApiError> {
        let ops = parse(patch)?;
        check(&ops, &RULES)?;
        let mut doc = doc;
        apply(&mut doc, &ops)?;
        Ok(doc)
    }

    #[test]
    fn patches_apply_as_rfc_6902_says() {
        let doc = json!({"driver": "agent_ilo", "driver_info": {"a": 1}, "instance_info": {},
                         "extra": {"l": [1, 2]}, "name": null});
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "add nested",
                json!([{"op": "add", "path": "/instance_info/image_source", "value": "http://x"}]),
                json!({"driver": "agent_ilo", "driver_info": {"a": 1}, "instance_info": {"image_source": "http://x"}, "extra": {"l": [1, 2]}, "name": null}),
            ),
            (
                "replace nested",
                json!([{"op": "replace", "path": "/driver_info/a", "value": 2}]),
                json!({"driver": "agent_ilo", "driver_info": {"a": 2}, "instance_info": {}, "extra": {"l": [1, 2]}, "name": null}),
            ),
            (
                "remove nested",
                json!([{"op": "remove", "path": "/driver_info/a"}]),
                json!({"driver": "agent_ilo", "driver_info": {}, "instance_info": {}, "extra": {"l": [1, 2]}, "name": null}),
            ),
            (
                "remove root resets",
                json!([{"op": "remove", "path": "/extra"}]),
                json!({"driver": "agent_ilo", "driver_info": {"a": 1}, "instance_info": {}, "extra": null, "name": null}),
            ),
            (
                "list append and insert",
                json!([{"op": "add", "path": "/extra/l/-", "value": 3}, {"op": "add", "path": "/extra/l/0", "value": 0}]),
                json!({"driver": "agent_ilo", "driver_info": {"a": 1}, "instance_info": {}, "extra": {"l": [0, 1, 2, 3]}, "name": null}),
            ),
            (
                "add root",
                json!([{"op": "add", "path": "/name", "value": "n1"}]),
                json!({"driver": "agent_ilo", "driver_info": {"a": 1}, "instance_info": {}, "extra": {"l": [1, 2]}, "name": "n1"}),
            ),
        ];
        for (name, patch, want) in cases {
            assert_eq!(run(doc.clone(), patch).expect(name), want, "{name}");
        }
    }

    #[test]
    fn bad_patches_are_refused_naming_the_problem() {
        let doc = json!({"driver": "agent_ilo", "driver_info": {"a": 1}, "instance_info": {}, "extra": {}, "name": null});
        let cases: Vec<(Value, &str)> = vec![
            (json!({"op": "add"}), "list of operations"),
            (json!([1]), "operation 0"),
            (
                json!([{"op": "move", "path": "/extra/a", "from": "/extra/b"}]),
                "\"op\"",
            ),
            (
                json!([{"op": "test", "path": "/extra/a", "value": 1}]),
                "\"op\"",
            ),
            (json!([{"path": "/extra/a", "value": 1}]), "\"op\""),
            (json!([{"op": "add", "value": 1}]), "\"path\""),
            (
                json!([{"op": "add", "path": "extra", "value": 1}]),
                "\"path\"",
            ),
            (
                json!([{"op": "add", "path": "/extra/a b", "value": 1}]),
                "\"path\"",
            ),
            (
                json!([{"op": "add", "path": "/extra//a", "value": 1}]),
                "\"path\"",
            ),
            (json!([{"op": "add", "path": "/extra/a"}]), "\"value\""),
            (
                json!([{"op": "replace", "path": "/provision_state", "value": "active"}]),
                "'/provision_state' is an internal attribute",
            ),
            (
                json!([{"op": "add", "path": "/driver_internal_info/x", "value": 1}]),
                "'/driver_internal_info' is an internal attribute",
            ),
            (
                json!([{"op": "remove", "path": "/driver"}]),
                "'/driver' is a mandatory attribute",
            ),
            (
                json!([{"op": "add", "path": "/bogus", "value": 1}]),
                "'/bogus'",
            ),
            (
                json!([{"op": "replace", "path": "/driver_info/missing", "value": 1}]),
                "does not exist",
            ),
            (
                json!([{"op": "remove", "path": "/extra/missing"}]),
                "does not exist",
            ),
            (
                json!([{"op": "add", "path": "/driver_info/a/b", "value": 1}]),
                "does not exist",
            ),
        ];
        for (patch, words) in cases {
            let e = run(doc.clone(), patch.clone()).expect_err(&patch.to_string());
            assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{patch}");
            assert!(e.message.contains(words), "{patch}: {e}");
        }
    }
}
