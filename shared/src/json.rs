//! Words about JSON values for error messages.

use serde_json::Value;

/// What kind of JSON value `value` is ("a string", "an object", ...), for a message that says
/// what was found instead of what was expected. Never the value itself: it may be a secret or
/// long.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_name_the_type_not_the_value() {
        let cases = [
            (json!(null), "null"),
            (json!(true), "a boolean"),
            (json!(3), "a number"),
            (json!("hunter2"), "a string"),
            (json!([1]), "an array"),
            (json!({"a": 1}), "an object"),
        ];
        for (value, want) in cases {
            assert_eq!(kind(&value), want, "{value}");
        }
    }
}
