//! The exit codes of every vmdeploy binary, and how an error picks one.
//!
//! # Design
//! Two codes, as in sysexits(3): [`USAGE`] (64, `EX_USAGE`) when the command line or the
//! configuration it names is wrong, so running again unchanged cannot help; [`FAILURE`] (1) when
//! something failed while running. A flow marks a configuration error by putting a
//! [`UsageError`] in its error chain (`.map_err(UsageError::wrap)` or
//! `Err(UsageError::new(..).into())`); [`code_for`] looks for one. Everything else is a run-time
//! failure. clap's own usage errors (exit 2 by default) are mapped to [`USAGE`] by each `main`.

use std::error::Error;

/// Bad usage or configuration (`EX_USAGE`).
pub const USAGE: u8 = 64;

/// A failure at run time.
pub const FAILURE: u8 = 1;

/// A command line or configuration error: the binary exits [`USAGE`]. It shows as the error it
/// wraps (same text, same causes), so marking an error changes no message.
#[derive(Debug)]
pub struct UsageError(Box<dyn Error + Send + Sync + 'static>);

impl UsageError {
    /// A usage error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into().into())
    }

    /// Marks `err` as a usage error.
    pub fn wrap(err: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        Self(err.into())
    }
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl Error for UsageError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// The exit code for an error, given its chain (`anyhow::Error::chain`): [`USAGE`] when any link
/// is a [`UsageError`], else [`FAILURE`].
pub fn code_for<'a>(chain: impl IntoIterator<Item = &'a (dyn Error + 'static)>) -> u8 {
    if chain.into_iter().any(|e| e.is::<UsageError>()) {
        USAGE
    } else {
        FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer step")]
    struct Outer(#[source] Box<dyn Error + Send + Sync>);

    #[test]
    fn a_usage_error_anywhere_in_the_chain_means_64() {
        let plain = std::io::Error::other("disk gone");
        assert_eq!(code_for([&plain as &(dyn Error + 'static)]), FAILURE);
        let usage = UsageError::new("--timeout must be at least 1 second");
        assert_eq!(usage.to_string(), "--timeout must be at least 1 second");
        let outer = Outer(Box::new(usage));
        let chain = [
            &outer as &(dyn Error + 'static),
            outer.source().expect("cause"),
        ];
        assert_eq!(code_for(chain), USAGE);
    }

    #[test]
    fn wrap_keeps_the_text_and_the_causes() {
        let wrapped = UsageError::wrap(std::io::Error::other("no such file"));
        assert_eq!(wrapped.to_string(), "no such file");
        assert!(
            wrapped.source().is_none(),
            "the text is not repeated as a cause"
        );
        let nested = UsageError::wrap(Outer(Box::new(std::io::Error::other("root cause"))));
        assert_eq!(nested.to_string(), "outer step");
        let cause = nested.source().expect("cause kept");
        assert_eq!(cause.to_string(), "root cause");
    }
}
