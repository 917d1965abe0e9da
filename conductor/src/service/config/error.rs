//! The configuration error: which key, and why.

/// A configuration error: which key, and why. `serve` exits 64 on it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    /// The dotted key (`api.listen`), or `configuration` for the file as a whole.
    pub key: String,
    /// What is wrong, and where it helps, how to fix it.
    pub reason: String,
}

impl ConfigError {
    pub(super) fn new(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
