//! Secrets (passwords, tokens, keys): one wrapper that never shows its value by accident.
//!
//! # Design
//! [`Secret`] prints as `******` through `Debug`, `Display` and `Serialize`, so a secret inside a
//! struct that derives `Debug` or is serialized for a log never reaches the log line (docs/architecture.md
//! §7). Reading the value takes an explicit [`Secret::expose`], which is easy to find in review.
//!
//! Masking `Serialize` is the safe default, but some wire bodies exist to carry a secret: the
//! agent token in a heartbeat, the deploy key in `pass_deploy_info`. Their fields opt in with
//! `#[serde(serialize_with = "crate::secret::serialize_exposed")]` (or
//! [`serialize_exposed_option`]), so the one place that sends the real value says so.
//! `Deserialize` reads the real value: a secret arriving on the wire is wrapped at once.
//!
//! Two secrets compare in constant time, so comparing a received token with the expected one
//! leaks nothing through timing.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use subtle::ConstantTimeEq as _;

/// What every secret shows instead of its value.
pub const MASK: &str = "******";

/// A secret value: masked in `Debug`, `Display` and `Serialize`; [`Secret::expose`] reads it.
#[derive(Clone, Default)]
pub struct Secret<T = String>(T);

impl<T> Secret<T> {
    /// Wraps a secret value.
    pub fn new(value: impl Into<T>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that must use it (a login, a digest, a wire body).
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret<String> {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl<T: AsRef<[u8]>> PartialEq for Secret<T> {
    /// Constant time in the length of the shorter value (only the lengths can leak).
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.0.as_ref().ct_eq(other.0.as_ref()))
    }
}

impl<T: AsRef<[u8]>> Eq for Secret<T> {}

impl<T> Serialize for Secret<T> {
    /// Masked: a body that must carry the value uses [`serialize_exposed`] on that field.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(MASK)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Secret<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Secret)
    }
}

/// Serializes the real value: for wire fields that exist to carry the secret
/// (`#[serde(serialize_with = "...::serialize_exposed")]`).
pub fn serialize_exposed<T: Serialize, S: Serializer>(
    secret: &Secret<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    secret.expose().serialize(serializer)
}

/// [`serialize_exposed`] for an optional secret.
pub fn serialize_exposed_option<T: Serialize, S: Serializer>(
    secret: &Option<Secret<T>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    secret.as_ref().map(Secret::expose).serialize(serializer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct Logged {
        user: String,
        password: Secret,
        key: Secret<Vec<u8>>,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Wire {
        #[serde(serialize_with = "serialize_exposed")]
        token: Secret,
        #[serde(serialize_with = "serialize_exposed_option")]
        key: Option<Secret>,
    }

    #[test]
    fn debug_display_and_serialize_mask() {
        let s: Secret = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), MASK);
        assert_eq!(format!("{s}"), MASK);
        assert_eq!(format!("{s:#?}"), MASK);
        assert_eq!(serde_json::to_string(&s).expect("json"), "\"******\"");
        assert_eq!(s.expose(), "hunter2");
        let logged = Logged {
            user: "admin".into(),
            password: Secret::new("hunter2"),
            key: Secret::new(b"k3y-bytes".to_vec()),
        };
        let shown = format!("{logged:?} {logged:#?} {}", serde_json::json!(logged));
        assert!(shown.contains("admin"), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("k3y"),
            "{shown}"
        );
    }

    #[test]
    fn wire_fields_carry_the_value_and_read_it_back() {
        let w = Wire {
            token: Secret::new("tok-123"),
            key: Some(Secret::new("key-456")),
        };
        let body = serde_json::to_value(&w).expect("json");
        assert_eq!(
            body,
            serde_json::json!({"token": "tok-123", "key": "key-456"})
        );
        assert!(!format!("{w:?}").contains("tok-123"));
        assert!(!format!("{w:?}").contains("key-456"));
        let back: Wire = serde_json::from_value(body).expect("parse");
        assert_eq!(back, w);
        let none = Wire {
            token: Secret::new("t"),
            key: None,
        };
        assert_eq!(
            serde_json::to_value(&none).expect("json"),
            serde_json::json!({"token": "t", "key": null})
        );
    }

    #[test]
    fn equality_is_by_value() {
        let a: Secret = Secret::new("abc");
        assert_eq!(a, Secret::new("abc"));
        assert_ne!(a, Secret::new("abd"));
        assert_ne!(a, Secret::new("ab"));
        assert_ne!(a, Secret::new(""));
    }

    proptest! {
        #[test]
        fn no_output_contains_the_value(value in "[a-zA-Z0-9]{7,40}") {
            let s: Secret = Secret::new(value.clone());
            let shown = format!("{s:?}{s}{}", serde_json::to_string(&s).expect("json"));
            prop_assert!(!shown.contains(&value));
            prop_assert_eq!(s.expose(), &value);
        }
    }
}
